"""The top of fedhetero's layers: what drives both ``simulation/`` and ``deploy/``.

``simulation/`` never imports ``deploy/`` (deploy is built on ``simulation.runtime``), so the
one ``fedhetero`` command (:mod:`fedhetero.cli`) and the benchmark that compares the two
runtimes (:mod:`fedhetero.deploy_bench`) live here, above both. Nothing imports this
package; it imports nothing on its own.
"""
