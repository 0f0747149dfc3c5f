"""Built-in gradpipe plugins.

Each module here is an ordinary plugin, registered through the ``gradpipe``
entry-point group of the ``gradpipe`` distribution, exactly like a third-party
plugin. None of them imports TensorFlow at import time.
"""
