"""How a name becomes a network: the architecture, free of weights and data.

- `specs`: `ResNetSpec` (every choice the paper varies), `resolve(name, **overrides)`, the
  name registry's functions; `registry`: every registered name, one spec each.
- `blocks`: the residual unit and its parts as plain functions; `graph`: stem, stages and
  head into a functional graph; `network`: `ResNet`, the Keras model that carries its spec.
- `scan`: a stage's identical units as one loop over stacked weights, and conversion
  between that form and the plain layer graph.
- `introspect`: layer names, unit outputs and output kinds read off a built model.
"""
