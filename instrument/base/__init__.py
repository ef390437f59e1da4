"""The torch-free base every other layer and ``exporters`` build on.

``report`` (``WindowReport``, the one contract between ``instrument`` and ``exporters``) with
the ``verdict`` words it carries and ``spans`` (fitting a window's occurrences into a span
budget); ``settings`` (``PROFILED_*`` declarations and their tolerant read), ``warn`` (the
one way the SDK warns), ``files`` (atomic writes) and ``formatting`` (times and table
columns). Imports nothing of the other layers and no torch (tests/test_layers.py holds it).
"""
