"""Fast paths. Each backend registers its implementations with geomkern._dispatch on import."""
