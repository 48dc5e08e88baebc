"""The command line, one module per subcommand (serve, generate, chat, bench, plan, eval, quantize) and main.py,
which parses the subcommand and hands over. Each module only turns flags into the package's own calls."""
