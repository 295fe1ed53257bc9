"""The MCP bridge: framing + strict parser, policy engine, and the proxy loop between them."""
