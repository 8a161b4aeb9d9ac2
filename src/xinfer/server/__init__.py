"""The OpenAI-compatible HTTP server (FastAPI + uvicorn) and the single-file chat page."""
