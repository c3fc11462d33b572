"""`shoal compare` building blocks: scheme specs, compare.json rows, plots and the HTML report.

Everything here is pure (files in, files out): the command in
``shoal.comparison`` runs the trainings and calls these.
"""
