"""Running jobs: the job's spec, the run itself, and the scheduler and operator actions above it.

A regular package (it was a namespace package) so that import-linter sees its modules.
"""
