# EMR Serverless custom image for Switchyard's PySpark job: the application's release (emr-7.9.0,
# Amazon Linux 2023, Spark 3.5, system Python 3.9) plus python3.11, the interpreter the packaged
# environment's bin/python launcher runs (switchyard spark package; docs/deployment.md: Submit the pipeline to EMR Serverless).
# The release here must equal stacks/constants.py EMR_RELEASE (tests/spark/test_emr.py checks it).
FROM public.ecr.aws/emr-serverless/spark/emr-7.9.0:latest
USER root
RUN dnf install -y python3.11 && dnf clean all && python3.11 --version
# EMR Serverless runs jobs as this user; the image must end with it.
USER hadoop:hadoop
