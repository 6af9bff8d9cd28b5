"""Exporting token models (recurrent and transformer): the graphs' modules and examples, and parity against PyTorch."""
