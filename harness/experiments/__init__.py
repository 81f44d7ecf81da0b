"""The reference texts' exercises as reproducible commands.

Each experiment is a module here with ``run(out_dir, ...) -> dict`` that measures, writes
``<out_dir>/<name>.json`` (its numbers plus machine info) and ``<out_dir>/<name>.png`` (its
plot), and returns the JSON's contents. ``python -m harness <name>`` runs one.
"""
