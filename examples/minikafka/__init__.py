"""A miniature Kafka broker built on purgatory_aio."""
