"""MCP servers the integration tests run inside containers."""
