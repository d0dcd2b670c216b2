"""xDS-enabled servers (gRFC A36, A29 server side, A41 RBAC).

``pyxds.xds_server(...)`` and ``pyxds.aio.xds_server(...)`` build a
``grpc.Server`` (or ``grpc.aio.Server``) whose listening ports serve what
the control plane's Listener for each port says, on the same XdsClient as
the process's pyxds channels.  The Listener watch, filter chain choice,
routing and RBAC evaluation are sans-IO (:mod:`.listener_watch`,
:mod:`.filter_chains`, :mod:`.routing`, :mod:`.rbac`); grpcio servers and
the per-RPC gate live at the edge (:mod:`.server`, :mod:`.aio_server`,
:mod:`.gate`).  See docs/xds-server.md.
"""
