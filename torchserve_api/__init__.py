"""TorchServe's management API, its key file and the errors both raise: the layer under `client` and `serving`.

`serving` polls a starting TorchServe through `management.ManagementClient` and reads its keys with
`tokens.from_key_file`; `client` builds its inference transports and its CLI on the same pieces. This package
imports only `settings` and third-party libraries, never `client` or `serving`.
"""
