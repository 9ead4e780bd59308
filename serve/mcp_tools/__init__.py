"""The MCP server's tools and resource, registered by `serve.mcp.build_server`: memories (add, get, list,
update, delete, restore, history), search, profile. Each is a function taking the server's `ToolState`
(state.py) first; the builder binds it, so clients see the other parameters only, and a tool's
docstring is the description clients give the model."""
