#!/bin/sh
echo "coverage tools are not available in this offline build" >&2
exit 1
