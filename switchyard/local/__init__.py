"""Local stand-ins for AWS machinery (event-source bridges, fake Lambda contexts)."""
