"""The service's routers: memories (add, extract, list, get, update, delete, history), search, ops."""
