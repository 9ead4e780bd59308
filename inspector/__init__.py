"""`dimmem inspect`: a local, read-only web inspector over the pipeline's outputs (datagen outputs, eval
runs, memory stores), server-rendered by FastAPI and Jinja2 with everything it loads in this package."""
