"""The torch-free analysis: a window's events -> the numbers, verdicts and occurrences in a
``WindowReport``.

``events`` (the normalised event and the trace-JSON front end), ``analyze`` (ranges,
operators, kernels, health), ``occurrences`` (per-call spans), ``peaks`` and ``throughput``
(MFU), ``kineto_json`` (reading, shaping and writing trace JSON). Imports only the base and
no torch: the analysis helper process and the ``torch-profiled`` command import it as is.
"""
