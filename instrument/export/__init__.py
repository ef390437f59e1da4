"""From a stopped window to the exporters: the report builder, the pipeline, the analysis
helper process and the raw traces' scratch directory.

``builder`` (a stopped window -> its ``WindowReport``), ``pipeline`` (a lane per exporter,
bounded, with deadlines), ``analysis_process`` (the torch-free helper process that shapes and
analyzes a window's trace off the program's GIL) and ``scratch`` (the raw traces' private
directory). The runtime's sessions, windows and stops hand windows here.
"""
