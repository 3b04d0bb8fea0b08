"""The images a run trains and is scored on.

- `catalog`: the datasets the zoo knows by name (classes, splits, preprocessing family).
- `sources`: a dataset as given (a TFDS name, an image folder or a `tf.data.Dataset`): its
  class names and splits, checked and prepared; `folders`: image folders read once.
- `pipeline`: the paper's training and evaluation input (`tf.data`), `augment`: its
  augmentation.
"""
