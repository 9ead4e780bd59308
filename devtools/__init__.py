"""What the tests, the benchmarks and the demo run the product against, from a checkout: the fake
OpenAI-compatible teacher, the demo's serving step, a sample pipeline run, the inspector in a browser and
its screenshots. Not installed: no product package imports them."""
