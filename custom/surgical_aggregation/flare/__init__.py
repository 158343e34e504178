"""The thin NVIDIA FLARE layer: server controller, persistor/locator, Client API script, job writer.

Everything here only translates between FLARE and the plain modules of the package.
"""
