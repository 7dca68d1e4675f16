"""The ``fedhetero`` command: every tool of this project behind one CLI (:mod:`fedhetero.cli`).

The library itself is :mod:`strategies`; the app is :mod:`fedapp`. This package only
dispatches to :mod:`simulation` and :mod:`deploy`, so it sits above both of them.
"""
