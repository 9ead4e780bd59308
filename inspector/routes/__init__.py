"""The inspector's routes, a router per kind of source (each page a GET: nothing is written)."""
