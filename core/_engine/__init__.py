"""The engine: how a built pipeline keeps its state and runs a step.

Private. Nothing here is part of gradpipe's API: users reach it through
``gradpipe.load``/``gradpipe.build`` and the ``Pipeline`` they return, and
plugin authors through ``gradpipe.plugin``.
"""
