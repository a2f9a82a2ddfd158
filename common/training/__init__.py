"""What a job trains: models, datasets and their partitioning, data files and plugins."""
