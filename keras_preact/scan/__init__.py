"""Scanned stages: a stage's identical residual units run as one loop over stacked weights.

Build them with `keras_preact.build(name, stages="scan")`: each stage's units 2..n become one
`ScannedUnits` layer (`keras_preact.scanned_units`), a graph that no longer grows with depth,
with the plain layer graph's math and parameter count. Convert a trained model either way with
`to_scanned` / `to_layered` (the plain graph is the one to inspect: its `Add` layers show the
identity path); `keras_preact.weights` loads a file of either form into either.
What the loop gains and costs is measured in benchmarks/README.md.

Example:
>>> import keras_preact
>>> from keras_preact import scan
>>> fast = keras_preact.build("preact-164", stages="scan", depth=20)
>>> plain = scan.to_layered(fast)
>>> plain.count_params() == fast.count_params()
True
"""

from keras_preact.scan.convert import copy_weights, to_layered, to_scanned
from keras_preact.scanned_units import (
    ScannedUnits,
    check_scannable,
    is_scanned,
    scannable,
    scanned_units,
    set_options,
)
from keras_preact.specs import STAGES

__all__ = ["STAGES", "ScannedUnits", "check_scannable", "copy_weights", "is_scanned",
           "scannable", "scanned_units", "set_options", "to_layered", "to_scanned"]
