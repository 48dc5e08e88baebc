"""The renderers of the docs' result tables (`scripts/render_docs.py` maps each `<!-- results:NAME -->` region to
one): a module per group of pages (docs/benchmarks/, ...), and `cells`, the table and number formats they share.
Not part of the installed package; import it from the repository root as `scripts.doc_tables`."""
