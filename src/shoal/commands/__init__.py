"""CLI commands, one module each; `shoal.cli` registers them on the typer app."""
