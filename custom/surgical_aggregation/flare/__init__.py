"""The NVIDIA FLARE layer, the only part of the package that imports ``nvflare``: the server workflow
(``controller`` and its rooms: ``handshake``, ``rounds``, ``state``, ``publication``, ``tasks``, ``settings``,
``results``), the persistor, the Client API script (``client``), the recipes that write the jobs, simulation, POC,
provisioning and deployment, experiment tracking, and the exchange audit.

It adapts the plain modules below it to FLARE; the rules it applies (checks, aggregation, selection) are those
modules' or plain functions of its own rooms, tested without FLARE.
"""
