"""``activedb …`` (``python -m tests.spark_bridge.drivers.kafka_shaped --records DIR [--per-batch N] -- ARGS``) with
Spark's Kafka source replaced by Kafka-shaped records read from files, for ``run --source kafka:BROKERS/TOPIC``
on a machine without a broker or Spark's Kafka connector.

Each file of ``DIR`` (oldest-modified first, ``N`` per micro-batch) is one record: its bytes are the record's
``value`` (``binary``), as a Kafka producer's would be; ``key``, ``topic``, ``partition``, ``offset``,
``timestamp`` and ``timestampType`` are Kafka's columns.  Everything after the records is ``activedb run``'s own
path (``spark_bridge._sources.build_stream`` parses the values as it parses a topic's).
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", required=True)
    parser.add_argument("--per-batch", type=int, default=1)
    options, rest = parser.parse_known_args(argv)

    from spark_bridge import _sources

    def records(spark, source):
        from pyspark.sql import functions

        files = (spark.readStream.format("binaryFile")
                 .schema("path STRING, modificationTime TIMESTAMP, length LONG, content BINARY")
                 .option("maxFilesPerTrigger", options.per_batch).load(options.records))
        return files.select(functions.lit(None).cast("binary").alias("key"), functions.col("content").alias("value"),
                            functions.lit(source.topic).alias("topic"), functions.lit(0).alias("partition"),
                            functions.lit(0).cast("long").alias("offset"),
                            functions.col("modificationTime").alias("timestamp"),
                            functions.lit(0).alias("timestampType"))

    _sources.kafka_records = records
    from activedb.cli import main as activedb

    activedb(args=[argument for argument in rest if argument != "--"], prog_name="activedb")


if __name__ == "__main__":
    main(sys.argv[1:])
