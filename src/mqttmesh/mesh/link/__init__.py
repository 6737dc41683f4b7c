"""Links: the peer-link table, the dialling client, the peer handshake and its authentication,
the hello, and the gateway between the local broker and the mesh."""
