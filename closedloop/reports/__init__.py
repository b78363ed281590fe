"""Every human-facing report: the gate's Markdown and the sentences the registry keeps (gate_report.py),
the iteration's HTML page (page.py loads its data, html.py renders it, page_plots.py draws its figures),
and the DVC plots the stages write (plots.py). Empty on purpose: the plots module sits low in the
layers (pipeline.py reads its definitions), the page high (it reads DVC and MLflow)."""
