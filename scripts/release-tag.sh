#!/usr/bin/env bash
# Tags HEAD as release VERSION and records it in RELEASES (make package runs
# it; the skew tests build the previous release from RELEASES, by tag or,
# in a clone without tags, by commit).
#
# Usage: scripts/release-tag.sh VERSION     e.g. scripts/release-tag.sh 0.39.0
#
#   - a development VERSION (ending in -dev, make's default) is not tagged;
#   - refuses a dirty tree: a release is a commit, not what happens to be
#     checked out;
#   - refuses when tag vVERSION exists at another commit (a release tag
#     never moves) or VERSION is older than the newest release recorded;
#   - otherwise tags HEAD (annotated), adds "vVERSION COMMIT" to RELEASES and
#     commits that one line ("releases: vVERSION is COMMIT"). The tag stays
#     on the released commit; the record is the commit after it, which
#     changes nothing else.
#   - run again on either commit it does nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

version=${1:?usage: scripts/release-tag.sh VERSION}
version=${version#v}
tag=v$version
if [[ $version == *-dev ]]; then
	echo "release-tag: $version is a development build: not tagged"
	exit 0
fi
if ! [[ $version =~ ^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z][0-9A-Za-z-]*)?$ ]]; then
	echo "release-tag: $version: want MAJOR.MINOR.PATCH[-PRERELEASE]" >&2
	exit 1
fi
if [[ -n $(git status --porcelain) ]]; then
	echo "release-tag: the tree has uncommitted changes; commit or stash them before tagging $tag" >&2
	git status --short >&2
	exit 1
fi

head=$(git rev-parse HEAD)
recorded=$(awk -v t="$tag" '$1 == t { print $2 }' RELEASES)

# The code of commit $1 is HEAD's own: they differ at most in RELEASES.
same_code() { git diff --quiet "$1" HEAD -- . ':(exclude)RELEASES'; }

if at=$(git rev-parse --verify --quiet "refs/tags/$tag^{commit}"); then
	if [[ -n $recorded && $recorded != "$at" ]]; then
		echo "release-tag: tag $tag names $at but RELEASES records $recorded" >&2
		exit 1
	fi
	if [[ -n $recorded ]] && same_code "$at"; then
		echo "release-tag: $tag is $at, recorded in RELEASES: nothing to do"
		exit 0
	fi
	if [[ $at != "$head" ]]; then
		echo "release-tag: tag $tag exists at $at, not at HEAD $head: a release tag never moves" >&2
		exit 1
	fi
	# Tagged at HEAD by hand: only the record is missing.
else
	if [[ -n $recorded ]]; then
		echo "release-tag: RELEASES records $tag at $recorded but this clone lacks the tag (git fetch --tags)" >&2
		exit 1
	fi
	newest=$(awk '$1 ~ /^v/ { v = $1 } END { print v }' RELEASES)
	if [[ -n $newest ]]; then
		core=${version%%-*} newcore=${newest#v}
		newcore=${newcore%%-*}
		if [[ $core != "$newcore" && $(printf '%s\n%s\n' "$core" "$newcore" | sort -V | head -1) == "$core" ]]; then
			echo "release-tag: $tag is older than the newest release $newest" >&2
			exit 1
		fi
	fi
	git tag -a "$tag" -m "edgeplane $version" "$head"
	echo "release-tag: tagged $tag at $head"
fi
printf '%s %s\n' "$tag" "$head" >>RELEASES
git add RELEASES
git commit --quiet -m "releases: $tag is ${head:0:12}" -- RELEASES
echo "release-tag: RELEASES records $tag ($(git rev-parse --short HEAD))"
