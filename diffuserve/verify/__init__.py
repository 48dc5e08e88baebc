"""`diffuserve verify MODEL`: the engine against a reference implementation on the user's own machine.

layer_view.py the first K layers of a checkpoint as a directory of their own (only their tensors read);
reference.py which reference runs (the checkpoint's code via `auto_map`, or transformers' class of the base
architecture) and building it; stand_ins.py, stand_in_ops.py and transformers_compat.py what a reference's files
import and this machine lacks; runners.py one causal forward of either side with every layer's hidden state;
conventions.py the attention-mask convention the reference reads; canvas.py DiffusionGemma's canvas forward;
compare.py the comparisons and their tolerances; block_steps.py one block through the reference's own loop;
report.py the table and the JSON; session.py the order of it all; cli/verify.py the subcommand.
"""
