"""One folder per model family: its model, config parser, weight names, its own layers and its `family.py` (the
`ModelFamily` record the registry loads by name). Nothing outside a family's folder imports it except the registry
(lazily, when a checkpoint names it), the planner's presets, and the references and benches that name it."""
