"""Live views of a machine for the console: tickets, the viewer's RFB parsed, the relay between a
viewer's WebSocket and the runner's view socket, and what a person sent (docs/protocol.md, "Live views")."""
