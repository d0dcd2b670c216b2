"""xDS transport security for clients (gRFC A29): the ``UpstreamTlsContext``
of a cluster (:mod:`.tls_config`), bootstrap certificate providers
(:mod:`.providers`), SAN matching (:mod:`.san`), the TLS relay that makes
Python's ``ssl`` the TLS layer of grpcio's subchannels (:mod:`.relay`) and
the channel credentials that opt in (:mod:`.credentials`)."""

from pyxds.security.credentials import XdsCredentialsInfo, xds_channel_credentials, xds_info

__all__ = ["XdsCredentialsInfo", "xds_channel_credentials", "xds_info"]
