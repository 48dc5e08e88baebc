"""`diffuserve verify MODEL`: the engine against a reference implementation on the user's own machine.

layer_view.py the first K layers of a checkpoint as a directory of their own (only their tensors read);
reference.py which reference runs (the checkpoint's code via `auto_map`, or transformers' class of the base
architecture) and building it; runners.py one causal forward of either side with every layer's hidden state;
compare.py the comparisons and their tolerances; block_steps.py the block-diffusion entry points a reference may
expose; report.py the table and the JSON; cli/main.py the subcommand.
"""
