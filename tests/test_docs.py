"""The examples in the public docstrings run and print what they say."""

import doctest

import pytest

import keras_preact
from keras_preact import applications, labels, preprocessing, specs


@pytest.mark.parametrize("module", [keras_preact, specs, labels, preprocessing, applications])
def test_docstring_examples(module):
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0
    assert result.failed == 0
