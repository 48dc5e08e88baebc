"""Text handling shared by the offline API and the server: the tokenizer (and the bounds of what it decodes), the
chat template (one renderer for both), and the tool-call format. Knows nothing of the engine or HTTP."""
