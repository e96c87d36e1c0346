"""Composition root and user-facing entry points: the CLI (`rubricem`, app/cli/), the Streamlit research chat
(app/ui/), batch reports, the MCP server, the retraining cycle and its scheduler, and the local vLLM launcher; the
only package that reads the environment."""
