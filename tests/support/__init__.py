"""Helpers the test modules share (imported as `support.<module>`; tests/ is on the path): devices, seeded models,
child processes, the reliability table's machinery, and Ray/HTTP helpers for serving. Test modules import from here,
never from each other or from conftest."""
