"""The parts of bench/scale.py (run that file; this package is not installed): common.py,
trace.py (the real trace), agents.py and poller.py (the simulated agents and the poller, each its
own process), procs.py (the farm's processes and their CPU), load.py (the load phase and its
report), bulk.py (the 100k phase)."""
