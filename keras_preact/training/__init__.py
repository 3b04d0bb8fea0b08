"""Training with the paper's recipe on `model.fit`, through `tf.distribute`, from TFDS.

Example:
>>> from keras_preact import training
>>> round(float(training.paper_schedule()(32000)), 4)
0.01
"""

from keras_preact.training.optimizer import SGDWithL2
from keras_preact.training.schedule import PaperSchedule, paper_schedule
from keras_preact.training.trainer import TrainingDiverged, evaluate, load_trained, train

__all__ = ["PaperSchedule", "SGDWithL2", "TrainingDiverged", "evaluate", "load_trained",
           "paper_schedule", "train"]
