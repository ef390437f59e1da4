"""The profiled process: ``@profiled``, sessions, windows, stops, metrics and torch.

``decorator`` and ``module`` (ranges), ``lifetime`` (the process-level API), ``state`` (all
process-wide mutable state), ``profiling_session`` (``Session``), ``planner``, ``sampling``,
``window``, ``stops``, ``triggers``, ``ranks``, ``ledger`` (what windows cost), ``metrics``,
``device_time``, ``collectives``, ``config`` and ``setting_kinds``, and ``_torch``, the only
module that touches torch's private APIs. Empty on purpose: importing one module of the
runtime imports no other.
"""
