"""Where weights come from and how they are stored.

- `records`: one record per published (model, tag): file, SHA-256, provenance, headline
  figure, and where the file is found (shipped, or downloaded with `keras.utils.get_file`);
  `published`: the records themselves (data), `released/`: the files that ship.
- `storage`: weights files of either form (plain layers or scanned stages) into either,
  plain `.keras` files that Keras alone loads, and `.keras` files as the network they declare.
- `timm`: timm's ResNetV2 checkpoints mapped onto the zoo's `-timm` networks.
"""
