"""LLM training-data preparation on Apache Beam: options, graph assembly and entry point."""
