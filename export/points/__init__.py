"""Exporting the book's point models: the graphs' modules and examples, and parity against PyTorch."""
