"""``python -m flashsim``: the whole program, as the ``flashsim`` console script runs it.

The one module of ``flashsim`` that imports a layer above it: it is the program's entry point,
never imported by the library, and the program (:mod:`analysis.cli`) is the simulator's commands
with the GPU side's registered beside them (see :mod:`flashsim.cli`).
"""

from analysis.cli import main

raise SystemExit(main())
