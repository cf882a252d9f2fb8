"""spark-submit / EMR Serverless entry point of the publish job: ``switchyard spark publish``'s body.

    spark-submit jobs/publish_requests.py --input s3://.../rows/ --output s3://.../out/ --pool NAME
"""

import sys

from switchyard.cli.spark import main

if __name__ == "__main__":
    sys.exit(main())
