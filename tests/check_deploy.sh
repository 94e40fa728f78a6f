#!/usr/bin/env bash
# check_deploy: lints the deployment files. Renders the Kubernetes
# overlays (deploy/k8s) with `kubectl kustomize` and checks the objects with
# jq, checks the Dockerfile's structure and the PrometheusRule against the
# alert rules. Nothing is started: the binary is only asked for its list of
# configuration keys and their defaults (`idemproc help config`).
#
#   tests/check_deploy.sh [--root DIR] [IDEMPROC]   check (DIR: the tree
#                                                   holding deploy/ and
#                                                   config/; default the
#                                                   repository's)
#   tests/check_deploy.sh --self-test [IDEMPROC]    break each check on a
#                                                   copy of the tree and
#                                                   assert that it fails
#
# IDEMPROC defaults to build/idemproc. One line per check, `ok - NAME` or
# `not ok - NAME: WHY`, then `N passed, N failed`; exit 1 when one failed.
# What starts a process (check-config on the rendered configuration, the
# pod rehearsal, build.sh) is the end-to-end tier's tests/e2e/test_deploy.c.
#
# The jq programs are single-quoted on purpose: their $names are jq's.
# shellcheck disable=SC2016
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
root=$repo
self_test=0
while [ $# -gt 0 ]; do
    case "$1" in
    --root)
        root=$(cd "$2" && pwd)
        shift 2
        ;;
    --self-test)
        self_test=1
        shift
        ;;
    -h | --help)
        sed -n '2,/test_deploy\.c\.$/p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
        exit 0
        ;;
    -*)
        echo "check_deploy.sh: unknown option $1 (see --help)" >&2
        exit 2
        ;;
    *) break ;;
    esac
done
bin=${1:-$repo/build/idemproc}
case "$bin" in /*) ;; *) bin=$PWD/$bin ;; esac

for tool in kubectl jq; do
    command -v "$tool" >/dev/null || {
        echo "check_deploy.sh: $tool is not on PATH (make deps)" >&2
        exit 2
    }
done
[ -x "$bin" ] || {
    echo "check_deploy.sh: $bin: no idemproc binary (make, or pass its path)" >&2
    exit 2
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# ---- the self-test ---------------------------------------------------------

# One defect per line: the check that must fail (its exact name), the file
# under the copied tree and the sed script that breaks it. Every check has
# at least one; a defect that breaks no check, or another check as well,
# fails the self-test. "none": an edit that is no defect, which every check
# must accept.
self_test_defects() {
    cat <<'EOF'
overlays render|deploy/k8s/base/pdb.yaml|s/maxUnavailable: 1/maxUnavailable: 2/
overlays render|deploy/k8s/components/keda/kustomization.yaml|/^patches:/,$d
dockerfile structure|deploy/docker/Dockerfile|s/^USER 10001:10001/USER idemproc/
dockerfile structure|deploy/docker/Dockerfile|s/^EXPOSE 9464/EXPOSE 9465/
pod security and limits|deploy/k8s/overlays/dev/redis.yaml|s/readOnlyRootFilesystem: true/readOnlyRootFilesystem: false/
pod security and limits|deploy/k8s/base/deployment.yaml|/^      automountServiceAccountToken: false/d
probes match http.listen|deploy/k8s/base/deployment.yaml|s|path: /readyz|path: /ready|
probes match http.listen|deploy/k8s/base/service.yaml|s/targetPort: metrics/targetPort: 9465/
grace period covers shutdown|deploy/k8s/base/deployment.yaml|s/terminationGracePeriodSeconds: 30/terminationGracePeriodSeconds: 24/
replicas bounded by partitions|deploy/k8s/base/hpa.yaml|s/maxReplicas: 6/maxReplicas: 8/
replicas bounded by partitions|deploy/k8s/components/keda/scaledobject.yaml|s/consumerGroup: idemproc-payments/consumerGroup: idemproc/
dev topics and traffic match config|deploy/k8s/overlays/dev/traffic-job.yaml|s/^            - payments$/            - payment/
dev topics and traffic match config|deploy/k8s/overlays/dev/topics.yaml|s/topicName: payments.dlq/topicName: payments-dlq/
networkpolicy allows only needed traffic|deploy/k8s/base/networkpolicy.yaml|s/port: 6379/port: 6380/
networkpolicy allows only needed traffic|deploy/k8s/overlays/production/kustomization.yaml|s/- port: 9093/- port: 9092/
prometheusrule matches alerts|config/alerts/idemproc.rules.yml|0,/for: 5m/s//for: 6m/
member id from pod name|deploy/k8s/base/deployment.yaml|s/fieldPath: metadata.name/fieldPath: metadata.uid/
pod environment is known keys|deploy/k8s/overlays/dev/traffic-job.yaml|s/enableServiceLinks: false/enableServiceLinks: true/
pod environment is known keys|deploy/k8s/base/deployment.yaml|/^            - name: IDEMPROC_MEMBER_ID/i\            - name: IDEMPROC_GROUPID\n              value: idemproc-payments
production credentials from secret files|deploy/k8s/overlays/production/idemproc.properties|s|^kafka.sasl.password.file=.*|kafka.sasl.password.file=/etc/idemproc/kafka-sasl-password|
production credentials from secret files|deploy/k8s/overlays/production/idemproc.properties|s|redis-ca.crt$|redis-ca.pem|
overlays render|deploy/k8s/components/script/kustomization.yaml|s|value: /etc/idemproc-script/orders.lua|value: /etc/idemproc-script/order.lua|
overlays render|deploy/k8s/components/webhook/kustomization.yaml|s|            optional: false|            optional: true|
overlays render|deploy/k8s/components/redis-cluster/kustomization.yaml|s|value: partition|value: global|
outbox component renders|deploy/k8s/components/outbox/networkpolicy.yaml|s/port: 5432/port: 5433/
outbox component renders|deploy/k8s/components/outbox/deployment.yaml|/^            defaultMode: 288/i\            optional: true
none|deploy/k8s/base/deployment.yaml|/^            - name: IDEMPROC_MEMBER_ID/i\            - name: IDEMPROC_KAFKA_FETCH_WAIT_MAX_MS\n              value: "100"\n            - name: IDEMPROC_REDIS_PASSWORD_FILE\n              value: /var/run/secrets/idemproc/redis-password\n            - name: IDEMPROC_SHUTDOWN_TIMEOUT_MS\n              value: "20000"
EOF
}

if [ "$self_test" = 1 ]; then
    self=${BASH_SOURCE[0]}
    # Each run in its own copy of deploy/ and config/, a few at a time.
    # run_copy N [FILE SED]: $work/N.out (the script's output), $work/N.rc.
    run_copy() {
        local tree=$work/tree$1
        mkdir -p "$tree"
        cp -R "$root/deploy" "$root/config" "$tree/"
        if [ $# -eq 3 ]; then
            local before
            before=$(cksum <"$tree/$2")
            sed -i -e "$3" "$tree/$2"
            if [ "$(cksum <"$tree/$2")" = "$before" ]; then
                echo "the sed script changed nothing" >"$work/$1.out"
                echo unchanged >"$work/$1.rc"
                return 0
            fi
        fi
        local rc=0
        bash "$self" --root "$tree" "$bin" >"$work/$1.out" 2>&1 || rc=$?
        echo "$rc" >"$work/$1.rc"
        rm -rf "$tree"
    }
    jobs_max=$(nproc 2>/dev/null || echo 2)
    [ "$jobs_max" -le 8 ] || jobs_max=8
    mapfile -t defects < <(self_test_defects)
    run_copy 0 &
    for i in "${!defects[@]}"; do
        while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n || true; done
        IFS='|' read -r check file script <<<"${defects[$i]}"
        run_copy $((i + 1)) "$file" "$script" &
    done
    wait

    passed=0 failed=0
    report() { # ok(0/1) name why
        if [ "$1" = 0 ]; then
            echo "ok - $2"
            passed=$((passed + 1))
        else
            echo "not ok - $2: $3"
            failed=$((failed + 1))
        fi
    }
    # The names of the failing checks in output N, comma separated.
    failing() { sed -n 's/^not ok - \([^:]*\):.*/\1/p' "$work/$1.out" | paste -sd ',' | sed 's/,/, /g'; }
    if [ "$(cat "$work/0.rc")" = 0 ]; then
        report 0 "self-test: the unchanged copy passes"
    else
        report 1 "self-test: the unchanged copy passes" "$(grep -v '^ok - ' "$work/0.out" | paste -sd ' ')"
    fi
    declare -A broken=()
    for i in "${!defects[@]}"; do
        n=$((i + 1))
        IFS='|' read -r check file script <<<"${defects[$i]}"
        name="self-test $n: $file ($script) fails only \"$check\""
        rc=$(cat "$work/$n.rc")
        got=$(failing "$n")
        if [ "$check" = none ]; then
            name="self-test $n: $file ($script) fails no check"
            if [ "$rc" = 0 ]; then
                report 0 "$name"
            else
                report 1 "$name" "exit $rc, failing: ${got:-none}; $(grep '^not ok' "$work/$n.out" | head -3 | paste -sd ' ')"
            fi
        elif [ "$rc" = 1 ] && [ "$got" = "$check" ] &&
            grep -q "^$(($(grep -c '^\(not \)\{0,1\}ok - ' "$work/$n.out") - 1)) passed, 1 failed$" "$work/$n.out"; then
            report 0 "$name"
            broken[$check]=1
        elif [ "$rc" = unchanged ]; then
            report 1 "$name" "the sed script changed nothing"
        else
            report 1 "$name" "exit $rc, failing: ${got:-none}; $(grep '^not ok' "$work/$n.out" | head -3 | paste -sd ' ')"
        fi
    done
    # Every check of the script has a defect that breaks it.
    while IFS= read -r check; do
        if [ -n "${broken[$check]:-}" ]; then
            report 0 "self-test: \"$check\" can fail"
        else
            report 1 "self-test: \"$check\" can fail" "no defect above breaks it alone"
        fi
    done < <(sed -n 's/^\(not \)\{0,1\}ok - \([^:]*\).*/\2/p' "$work/0.out")
    echo "$passed passed, $failed failed"
    [ "$failed" = 0 ]
    exit
fi

# ---- rendering -------------------------------------------------------------

k8s=$root/deploy/k8s

# YAML file -> JSON array of its objects, offline: `kubectl annotate
# --local` parses built-in kinds and CRDs alike without a cluster.
yaml_to_json() { # file out.json
    kubectl annotate --local -f "$1" -o json idemproc.io/parsed=1 | jq -s '
        map(if .kind == "List" then .items[] else . end)' >"$2"
}

# Renders a kustomization directory into $work/NAME.json; its errors into
# $work/NAME.err. Returns 1 when kustomize fails.
render() { # dir name
    if kubectl kustomize "$1" >"$work/$2.yaml" 2>"$work/$2.err" &&
        [ -s "$work/$2.yaml" ] &&
        yaml_to_json "$work/$2.yaml" "$work/$2.json" 2>>"$work/$2.err"; then
        return 0
    fi
    rm -f "$work/$2.json"
    return 1
}

# The dev overlay with an optional component, through a throwaway
# kustomization (kustomize takes relative paths only).
render_dev_with() { # component
    local dir=$work/dev-$1
    mkdir -p "$dir"
    cat >"$dir/kustomization.yaml" <<EOF
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - $(realpath --relative-to="$dir" "$k8s/overlays/dev")
components:
  - $(realpath --relative-to="$dir" "$k8s/components/$1")
EOF
    render "$dir" "dev+$1"
}

overlays=(dev production)
for ov in "${overlays[@]}"; do
    render "$k8s/overlays/$ov" "$ov" || true
done
render_dev_with keda || true
render_dev_with outbox || true
render_dev_with script || true
render_dev_with webhook || true
render_dev_with redis-cluster || true

# What the binary knows: {"keys": {key: default or null}, "prefixes":
# ["kafka.", ...], "file": true when <key>.file is accepted}.
"$bin" help config >"$work/help.txt"
jq -R -s '
    split("\n") as $l
    | [range(0; $l | length) as $i
       | $l[$i] | capture("^  (?<key>[^ ]+)  ") | .key as $k
       | {key: $k,
          default: (first($l[$i + 1] // "" | capture("^ +default: (?<d>.*)$").d
                          | select(. != "(none)")) // null)}] as $rows
    | {keys: ([$rows[] | select(.key | test("<") | not)]
              | map({key, value: .default}) | from_entries),
       prefixes: [$rows[].key | select(test("^[a-z.]+\\.<[a-z]+>$"))
                  | sub("<[a-z]+>$"; "")],
       file: any($rows[].key; . == "<key>.file")}' "$work/help.txt" >"$work/known.json"

# ---- jq helpers shared by the checks --------------------------------------

JQ_LIB='
def obj($kind; $name): first(.[] | select(.kind == $kind and .metadata.name == $name)) // null;
def obj_prefix($kind; $p): first(.[] | select(.kind == $kind and (.metadata.name // "" | startswith($p)))) // null;
def obj_any($kind): first(.[] | select(.kind == $kind)) // null;
def count($kind): [.[] | select(.kind == $kind)] | length;
def processor: obj("Deployment"; "idemproc");
def container($w; $name): first($w.spec.template.spec.containers[]? | select(.name == $name)) // null;
def volume($w; $name): first($w.spec.template.spec.volumes[]? | select(.name == $name)) // null;
def mount($c; $vol): first($c.volumeMounts[]? | select(.name == $vol) | .mountPath) // null;
def int: if type == "number" then . elif type == "string" then (tonumber? // 0) else null end;
def show: if . == null then "(none)" else tostring end;
def envname: "IDEMPROC_" + (ascii_upcase | gsub("[.-]"; "_"));
# key=value lines, as the processor reads them (later lines win).
def props: reduce (split("\n")[] | sub("^\\s+"; "") | sub("\\s+$"; "")
                   | select(length > 0 and (test("^[#!]") | not) and test("="))
                   | capture("^(?<k>[^=]*)=(?<v>.*)$"))
             as $p ({}; .[$p.k | sub("\\s+$"; "")] = ($p.v | sub("^\\s+"; "")));
# The properties file that container $c of workload $w reads (-c FILE in
# its args, a file of the ConfigMap mounted at its directory).
def conf_text($w; $c):
    ($c.args // []) as $a
    | (first(range(1; $a | length) | select($a[.] == "-c" or $a[.] == "--config")) // null) as $i
    | if $i == null then "" else
        $a[$i + 1] as $file
        | (first($c.volumeMounts[]? | select(.mountPath as $mp | $file | startswith($mp + "/"))) // null) as $m
        | if $m == null then "" else
            (obj("ConfigMap"; volume($w; $m.name).configMap.name).data[$file | ltrimstr($m.mountPath + "/")] // "")
          end
      end;
# The effective configuration of container $c of $w: the binary defaults
# < the ConfigMap file < IDEMPROC_* values of its env < --set key=value.
def pod_conf($w; $c; $known):
    ($known.keys | with_entries(select(.value != null))) + (conf_text($w; $c) | props) as $base
    | ([$known.keys, $base | keys[]] | unique) as $all
    | reduce ($c.env[]? | select(.value != null)) as $e ($base;
        (first($all[] | select(envname == $e.name)) // null) as $k
        | if $k != null then .[$k] = $e.value
          elif ($e.name | startswith("IDEMPROC_KAFKA_")) then
            .["kafka." + ($e.name | ltrimstr("IDEMPROC_KAFKA_") | ascii_downcase | gsub("_"; "."))] = $e.value
          else . end)
    | reduce (($c.args // []) as $a | range(1; $a | length) | select($a[.] == "--set") | $a[. + 1]
              | select(. != null and test("=")) | capture("^(?<k>[^=]*)=(?<v>.*)$")) as $s
        (.; .[$s.k] = $s.v);
def proc_conf($known):
    processor as $d | container($d; "idemproc") as $c
    | if $c == null then error("\($ov): no container idemproc in a Deployment idemproc")
      else pod_conf($d; $c; $known) end;
# A probe or Service port (name or number) as the container number.
def container_port($c; $p):
    if ($p | type) == "number" then $p
    else (first($c.ports[]? | select(.name == $p) | .containerPort) // -1) end;
def kafka_topic($t): first(.[] | select(.kind == "KafkaTopic" and ((.spec.topicName // .metadata.name) == $t))) // null;
def listen_port($conf): ($conf["http.listen"] // "") | if test(":") then sub(".*:"; "") | tonumber? // -1 else -1 end;
def listen_host($conf): ($conf["http.listen"] // "") | sub(":[^:]*$"; "");
'

# jq over one rendering: the objects as input, the keys of the binary as
# $known, the overlay name as $ov; prints failure lines.
jqr() { # name filter [jq args...]
    local name=$1 filter=$2
    shift 2
    [ -f "$work/$name.json" ] || {
        echo "$name: the overlay did not render"
        return 0
    }
    jq -r --arg ov "$name" --slurpfile knownf "$work/known.json" "$@" \
        "$JQ_LIB"' $knownf[0] as $known | '"$filter" "$work/$name.json"
}

# ---- the checks: each prints one line per failure -------------------------

# overlays_render
check_overlays_render() {
    for ov in "${overlays[@]}"; do
        if [ ! -f "$work/$ov.json" ]; then
            echo "$ov: kubectl kustomize failed: $(tr '\n' ' ' <"$work/$ov.err")"
            continue
        fi
        jqr "$ov" '
            ((["Deployment", "idemproc"], ["Service", "idemproc-metrics"],
              ["NetworkPolicy", "idemproc"], ["ServiceMonitor", "idemproc"],
              ["PrometheusRule", "idemproc"], ["HorizontalPodAutoscaler", "idemproc"]) as [$k, $n]
             | if obj($k; $n) == null then "\($ov): no \($k) \($n)" else empty end),
            (if obj_prefix("ConfigMap"; "idemproc-config-") == null then "\($ov): no ConfigMap idemproc-config-*" else empty end),
            ((obj("PodDisruptionBudget"; "idemproc").spec.maxUnavailable | int) as $mu
             | if $mu != 1 then "\($ov): PodDisruptionBudget idemproc maxUnavailable \($mu | show), want 1" else empty end),
            if $ov == "dev" then
                (if count("KafkaTopic") < 2 then "dev: \(count("KafkaTopic")) KafkaTopics, want at least 2" else empty end),
                ((["Deployment", "idemproc-redis"], ["Service", "idemproc-redis"], ["Job", "idemproc-traffic"]) as [$k, $n]
                 | if obj($k; $n) == null then "dev: no \($k) \($n)" else empty end)
            else
                (if count("Job") != 0 then "\($ov): test traffic (a Job) must not reach production" else empty end),
                (if obj("Deployment"; "idemproc-redis") != null then "\($ov): the throwaway Redis must not reach production" else empty end),
                (if count("Secret") != 0 then "\($ov): production Secrets are created out of band, \(count("Secret")) rendered" else empty end)
            end'
    done
    # The handler components: the script from its own ConfigMap, the
    # webhook's headers from a required Secret, each file where the
    # configuration names it.
    for c in script webhook redis-cluster; do
        if [ ! -f "$work/dev+$c.json" ]; then
            echo "dev+$c: kubectl kustomize failed: $(tr '\n' ' ' <"$work/dev+$c.err")"
        fi
    done
    jqr dev+script '
        processor as $d | container($d; "idemproc") as $c | pod_conf($d; $c; $known) as $conf
        | volume($d; "script") as $v | mount($c; "script") as $m
        | if $conf.handler != "script" then "dev+script: handler \($conf.handler | show), want script"
          elif $m == null or ($v.configMap.name // "" | . == "idemproc-script" | not)
          then "dev+script: no ConfigMap idemproc-script mounted"
          elif (obj("ConfigMap"; $v.configMap.name).data[$conf["script.file"] | ltrimstr($m + "/")] // null) == null
          then "dev+script: script.file \($conf["script.file"] | show) is not a file of the mounted ConfigMap"
          else empty end'
    # Redis Cluster mode: seed nodes, and what check-config requires with
    # them (the partition layout, the ledger).
    jqr dev+redis-cluster '
        proc_conf($known) as $conf
        | if ($conf["redis.cluster.nodes"] // "" | test("^[^,: ]+:[0-9]+(,[^,: ]+:[0-9]+)*$") | not)
          then "dev+redis-cluster: redis.cluster.nodes \($conf["redis.cluster.nodes"] | show) is no host:port list"
          elif $conf["dedup.scope"] != "partition" then "dev+redis-cluster: dedup.scope \($conf["dedup.scope"] | show), cluster mode needs partition"
          elif $conf.handler != "ledger" then "dev+redis-cluster: handler \($conf.handler | show), cluster mode runs ledger"
          else empty end'
    jqr dev+webhook '
        processor as $d | container($d; "idemproc") as $c | pod_conf($d; $c; $known) as $conf
        | volume($d; "webhook") as $v | mount($c; "webhook") as $m
        | ($c.env[]? | select(.name == "IDEMPROC_WEBHOOK_HEADERS_FILE") | .value) as $hf
        | if $conf.handler != "webhook" then "dev+webhook: handler \($conf.handler | show), want webhook"
          elif $v.secret.secretName != "idemproc-webhook" or $v.secret.optional != false
          then "dev+webhook: the headers must come from the required Secret idemproc-webhook"
          elif ($hf // "" | startswith(($m // "?") + "/")) | not
          then "dev+webhook: webhook.headers.file \($hf | show) is not under the Secret mount \($m | show)"
          elif count("Secret") != 0 then "dev+webhook: the Secret is created out of band, not rendered"
          else empty end'
    if [ ! -f "$work/dev+keda.json" ]; then
        echo "dev+keda: kubectl kustomize failed: $(tr '\n' ' ' <"$work/dev+keda.err")"
        return 0
    fi
    jqr dev+keda '
        (if obj("ScaledObject"; "idemproc") == null then "dev+keda: no ScaledObject idemproc" else empty end),
        (if count("HorizontalPodAutoscaler") != 0 then "dev+keda: KEDA owns the HPA; the base one must be removed" else empty end)'
}

# dockerfile_structure: instructions with continuation lines joined and
# comments dropped, as "stage<TAB>OP<TAB>argument" lines.
dockerfile_instructions() {
    awk '
        { sub(/^[ \t]+/, "") }
        /^#/ || /^$/ { next }
        {
            cont = sub(/\\$/, "")
            logical = logical $0 " "
            if (cont) next
            op = logical; sub(/[ \t].*/, "", op); op = toupper(op)
            arg = substr(logical, length(op) + 1)
            sub(/^[ \t]+/, "", arg); sub(/[ \t]+$/, "", arg)
            if (op == "FROM") stage++
            printf "%d\t%s\t%s\n", stage - 1, op, arg
            logical = ""
        }' "$root/deploy/docker/Dockerfile"
}

check_dockerfile_structure() {
    local file=$root/deploy/docker/Dockerfile
    [ -r "$file" ] || {
        echo "cannot read deploy/docker/Dockerfile"
        return 0
    }
    dockerfile_instructions | jq -R -s -r '
        [split("\n")[] | select(length > 0) | split("\t")
         | {stage: (.[0] | tonumber), op: .[1], arg: (.[2:] | join("\t"))}] as $in
        | ($in | map(.stage) | max) as $last
        | [$in[] | select(.stage == $last)] as $final
        | def squeeze: gsub("\\s"; "");
          def final_ops($op): [$final[] | select(.op == $op)];
        ($in[] | select(.op == "FROM" and .stage == 0)
         | if (.arg | ascii_downcase) != "debian:bookworm as build"
           then "first stage must be FROM debian:bookworm AS build, got \(.arg)" else empty end),
        ($in[] | select(.op == "FROM" and .stage == $last)
         | if .arg != "debian:bookworm-slim" then "final stage FROM \(.arg), want debian:bookworm-slim" else empty end),
        # Packages and the build go through build.sh, the part of the image
        # the end-to-end tests run.
        ($in[] | select(.op == "RUN" and (.arg | contains("apt-get") or contains("make ")))
         | "RUN installs or builds without build.sh: \(.arg)"),
        (final_ops("USER")[] | .arg as $a
         | if ($a | test("^[0-9]+(:.*)?$") | not)
           then "USER must be numeric (runAsNonRoot can only verify a number): \($a)"
           elif ($a | sub(":.*"; "") | tonumber) != 10001 then "USER \($a), want 10001"
           else empty end),
        (final_ops("ENTRYPOINT")[] | if (.arg | squeeze) != "[\"idemproc\"]"
           then "ENTRYPOINT \(.arg), want [\"idemproc\"]" else empty end),
        (final_ops("CMD")[] | if (.arg | squeeze) != "[\"run\",\"-c\",\"/etc/idemproc/idemproc.properties\"]"
           then "CMD \(.arg), want [\"run\", \"-c\", \"/etc/idemproc/idemproc.properties\"]" else empty end),
        ($in[] | select(.op == "ENV" and (.arg | contains("IDEMPROC_")))
         | "ENV \(.arg): the processor rejects unknown IDEMPROC_* variables"),
        (if ([$in[] | select(.op == "FROM")] | length) < 2 then "multi-stage build expected" else empty end),
        (if final_ops("USER") == [] then "final stage has no USER" else empty end),
        (if final_ops("ENTRYPOINT") == [] or final_ops("CMD") == [] then "final stage needs ENTRYPOINT and CMD" else empty end),
        (if any(final_ops("EXPOSE")[]; .arg | contains("9464")) | not then "EXPOSE 9464 missing" else empty end),
        ([$in[] | select(.op == "RUN" and .stage == 0) | .arg] as $b
         | if ([("build.sh deps", "build.sh build", "build.sh check-runtime") as $s | any($b[]; contains($s))] | all) | not
           then "build stage must RUN build.sh deps, build and check-runtime" else empty end),
        (if any(final_ops("RUN")[]; .arg | contains("build.sh runtime-deps")) | not
         then "runtime stage must RUN build.sh runtime-deps" else empty end),
        (("org.opencontainers.image.title", "org.opencontainers.image.description",
          "org.opencontainers.image.version", "org.opencontainers.image.source") as $l
         | if any(final_ops("LABEL")[]; .arg | contains($l)) | not then "LABEL \($l) missing" else empty end)'
}

# pod_security_and_limits
check_pod_security_and_limits() {
    for ov in "${overlays[@]}"; do
        jqr "$ov" '
            ((.[] | select(.kind == "Deployment" or .kind == "Job")) as $o
            | "\($ov) \($o.metadata.name)" as $at
            | $o.spec.template.spec as $pod | ($pod.securityContext // {}) as $psc
            | (if $pod.automountServiceAccountToken != false then "\($at): automountServiceAccountToken must be false (no API access needed)" else empty end),
              ($pod.containers[]? as $c | ($c.securityContext // {}) as $sc
               | "\($at) \($c.name)" as $cat
               | (if ($sc.runAsNonRoot == true or $psc.runAsNonRoot == true) | not then "\($cat): runAsNonRoot" else empty end),
                 (if ($sc.seccompProfile.type // $psc.seccompProfile.type) != "RuntimeDefault" then "\($cat): seccompProfile RuntimeDefault" else empty end),
                 (if $sc.allowPrivilegeEscalation != false then "\($cat): allowPrivilegeEscalation false" else empty end),
                 (if $sc.readOnlyRootFilesystem != true then "\($cat): readOnlyRootFilesystem" else empty end),
                 (if $sc.capabilities.drop[0]? != "ALL" then "\($cat): capabilities drop ALL" else empty end),
                 (("requests", "limits") as $r | ("cpu", "memory") as $m
                  | if $c.resources[$r][$m]? == null then "\($cat): resources.\($r).\($m)" else empty end),
                 if ($c.image // "" | contains("idemproc")) then
                   (($sc.runAsUser // $psc.runAsUser) as $uid
                    | if $uid != 10001 then "\($cat): runAsUser \($uid | show), want 10001" else empty end),
                   # A read-only root needs a writable /tmp.
                   ([$c.volumeMounts[]? | select(.mountPath == "/tmp")] | last) as $tm
                   | if $tm == null or volume($o; $tm.name).emptyDir == null then "\($cat): /tmp must be an emptyDir" else empty end
                 else empty end)),
            (processor as $d | if $d == null then "\($ov): no Deployment idemproc" else
                (if $d.spec.template.spec.topologySpreadConstraints[0]? == null then "\($ov): topologySpreadConstraints" else empty end),
                (if container($d; "idemproc").lifecycle.preStop == null then "\($ov): preStop hook" else empty end),
                (if $d.spec.replicas != null then "\($ov): replicas belong to the autoscaler" else empty end)
              end)'
    done
}

# probes_match_http_listen
check_probes_match_http_listen() {
    for ov in "${overlays[@]}"; do
        jqr "$ov" '
            proc_conf($known) as $conf
            | listen_port($conf) as $port | listen_host($conf) as $host
            | processor as $d | container($d; "idemproc") as $c
            | obj("Service"; "idemproc-metrics") as $svc | $svc.spec.ports[0]? as $sp
            | obj("ServiceMonitor"; "idemproc") as $sm
            | if ($conf["http.listen"] // "") == "" then "\($ov): http.listen is empty: no probes possible"
              elif $port < 0 then "\($ov): http.listen=\($conf["http.listen"]) has no port"
              else
                (if ($host == "0.0.0.0" or $host == "[::]" or $host == "") | not
                 then "\($ov): http.listen host \($host): the kubelet probes the pod IP" else empty end),
                (({probe: "startupProbe", path: "/healthz"}, {probe: "livenessProbe", path: "/healthz"},
                  {probe: "readinessProbe", path: "/readyz"}) as $p
                 | $c[$p.probe].httpGet as $g
                | if $g == null then "\($ov): no \($p.probe).httpGet" else
                    (if $g.path != $p.path then "\($ov) \($p.probe): path \($g.path | show), want \($p.path)" else empty end),
                    (container_port($c; $g.port) as $gp
                     | if $gp != $port then "\($ov) \($p.probe): port \($g.port | show) is not the port of http.listen (\($port))" else empty end)
                   end),
                (container_port($c; $sp.targetPort) as $tp
                 | if $tp != $port then "\($ov): Service idemproc-metrics targetPort \($sp.targetPort | show) is not the port of http.listen (\($port))" else empty end),
                (if $sm.spec.endpoints[0].port? != $sp.name then "\($ov): ServiceMonitor port \($sm.spec.endpoints[0].port? | show) is not the Service port \($sp.name | show)" else empty end),
                (if $sm.spec.endpoints[0].path? != "/metrics" then "\($ov): ServiceMonitor path \($sm.spec.endpoints[0].path? | show), want /metrics" else empty end),
                # The ServiceMonitor and the Service select the processor pods.
                ($d.spec.template.metadata.labels as $labels
                 | ($svc.spec.selector // {}) | to_entries[]
                 | if $labels[.key] != .value then "\($ov): Service selector \(.key)=\(.value) does not match the pods" else empty end),
                (($sm.spec.selector.matchLabels // {}) | to_entries[]
                 | if $svc.metadata.labels[.key] != .value then "\($ov): ServiceMonitor selector \(.key) does not match the Service" else empty end)
              end'
    done
}

# grace_period_covers_shutdown: the pod gets the time to run preStop and
# then shut down cleanly, or the kubelet kills it mid-commit.
check_grace_period_covers_shutdown() {
    for ov in "${overlays[@]}"; do
        jqr "$ov" '
            proc_conf($known) as $conf
            | ($conf["shutdown.timeout.ms"] | int) as $shutdown
            | processor as $d
            | ($d.spec.template.spec.terminationGracePeriodSeconds | int // -1) as $grace
            | container($d; "idemproc").lifecycle.preStop as $pre
            | (if $pre.sleep.seconds != null then ($pre.sleep.seconds | int) * 1000
               elif $pre.exec.command[0]? == "sleep" then ($pre.exec.command[1] | int) * 1000
               else 0 end) as $pre_ms
            | if $shutdown == null then "\($ov): shutdown.timeout.ms has no value"
              elif $grace * 1000 <= $shutdown then
                "\($ov): terminationGracePeriodSeconds \($grace) <= shutdown.timeout.ms \($shutdown)"
              elif $grace * 1000 <= $shutdown + $pre_ms then
                "\($ov): grace \($grace) s does not cover preStop \($pre_ms) ms + shutdown \($shutdown) ms"
              else empty end'
    done
}

# replicas_bounded_by_partitions: members beyond the input topic's
# partition count have nothing to consume.
check_replicas_bounded_by_partitions() {
    for ov in "${overlays[@]}"; do
        jqr "$ov" '
            obj("HorizontalPodAutoscaler"; "idemproc") as $hpa
            | ($hpa.spec.maxReplicas | int) as $max | ($hpa.spec.minReplicas | int) as $min
            | ($hpa.metadata.annotations["idemproc.io/input-partitions"] | int // -1) as $parts
            | (if $parts <= 0 then "\($ov): HPA lacks idemproc.io/input-partitions" else empty end),
              (if $max == null or $max > $parts then "\($ov): maxReplicas \($max | show) > partitions \($parts)" else empty end),
              (if $min == null or $min < 1 or $min > $max then "\($ov): minReplicas \($min | show)" else empty end),
              if $ov == "dev" then
                proc_conf($known)["input.topics"] as $topic
                | kafka_topic($topic) as $kt
                | if $kt == null then "dev: no KafkaTopic for input.topics=\($topic | show)" else
                    ($kt.spec.partitions | int) as $kparts
                    | (if $max > $kparts then "dev: maxReplicas \($max) > \($topic) has \($kparts)" else empty end),
                      (if $parts != $kparts then "dev: the HPA annotation says \($parts) partitions, the KafkaTopic \($kparts)" else empty end)
                  end
              else empty end'
    done
    jqr dev+keda '
        proc_conf($known) as $conf
        | obj("ScaledObject"; "idemproc") as $so
        | kafka_topic($conf["input.topics"]) as $kt
        | $so.spec.triggers[0]? as $t
        | (if $so == null then "dev+keda: no ScaledObject idemproc"
           elif ($so.spec.maxReplicaCount | int) > ($kt.spec.partitions | int // -1)
           then "dev+keda: maxReplicaCount \($so.spec.maxReplicaCount) > partitions \($kt.spec.partitions | show) of \($conf["input.topics"])"
           else empty end),
          (if $t.type != "kafka" then "dev+keda: trigger type \($t.type | show), want kafka" else empty end),
          (["topic", "input.topics"], ["consumerGroup", "group.id"], ["bootstrapServers", "kafka.bootstrap.servers"]) as [$f, $k]
          | if $t.metadata[$f]? != $conf[$k] then "dev+keda: trigger \($f) \($t.metadata[$f]? | show) is not \($k) \($conf[$k] | show)" else empty end'
}

# dev_topics_and_traffic_match_config: dev is self-contained; its topics
# (the DLQ too) exist in its Strimzi cluster, the processor and the traffic
# Job reach that cluster.
check_dev_topics_and_traffic_match_config() {
    jqr dev '
        proc_conf($known) as $conf
        | $conf["input.topics"] as $topic | $conf["dlq.topic"] as $dlq
        | $conf["kafka.bootstrap.servers"] as $bootstrap
        | obj_any("Kafka") as $kafka
        | if $kafka == null then "dev: no Strimzi Kafka" else
            $kafka.metadata.name as $cluster
            | "\($cluster)-kafka-bootstrap:\($kafka.spec.kafka.listeners[0].port? | show)" as $want
            | (if $bootstrap != $want then "dev: kafka.bootstrap.servers \($bootstrap | show), want \($want)" else empty end),
              (($topic, $dlq) as $t | kafka_topic($t) as $kt
               | if $kt == null then "dev: no KafkaTopic \($t | show)"
                 elif $kt.metadata.labels["strimzi.io/cluster"] != $cluster
                 then "dev: KafkaTopic \($t) is not in cluster \($cluster)" else empty end),
              (obj("Job"; "idemproc-traffic").spec.template.spec.containers[0].args? // [] | . as $a
               | (if $a[0] != "produce" then "dev: the traffic Job does not run produce" else empty end),
                 (range(1; ($a | length) - 1) as $i
                  | if $a[$i] == "-b" and $a[$i + 1] != $bootstrap then "dev: traffic -b \($a[$i + 1]) is not kafka.bootstrap.servers \($bootstrap)"
                    elif $a[$i] == "-t" and $a[$i + 1] != $topic then "dev: traffic -t \($a[$i + 1]) is not input.topics \($topic)"
                    else empty end)),
              (if ($conf["redis.url"] // "" | contains("//idemproc-redis:")) | not
               then "dev: redis.url \($conf["redis.url"] | show) is not the dev Redis Service" else empty end)
          end'
}

# networkpolicy_allows_only_needed_traffic: egress to DNS, the Kafka ports
# of kafka.bootstrap.servers and the Redis port of redis.url, nothing else;
# ingress to the metrics port only.
check_networkpolicy_allows_only_needed_traffic() {
    for ov in "${overlays[@]}"; do
        jqr "$ov" '
            proc_conf($known) as $conf
            | [($conf["kafka.bootstrap.servers"] // "" | split(",")[])] as $servers
            | ($conf["redis.url"] // "" | sub("^[^/]*//"; "") | sub(".*@"; "") | sub("/.*"; "")
               | if test(":") then sub("^[^:]*:"; "") | int else 6379 end) as $redis_port
            | ([53] + [$servers[] | select(test(":")) | sub(".*:"; "") | int] + [$redis_port] | unique) as $need
            | obj("NetworkPolicy"; "idemproc") as $np
            | [$np.spec.egress[]?.ports[]?.port | int] as $allowed
            | ($servers[] | select(test(":") | not) | "\($ov): bootstrap \(.) without port"),
              ($np.spec.egress[]? | select((.ports // []) | length == 0) | "\($ov): an egress rule without ports allows all"),
              ($allowed[] | select(. as $p | $need | index([$p]) | not) | "\($ov): egress port \(.) is not Kafka, Redis or DNS"),
              ($need[] | select(. as $p | $allowed | index([$p]) | not) | "\($ov): egress to port \(.) is needed"),
              (listen_port($conf) as $metrics | $np.spec.ingress[]?
               | if (.ports // []) | length != 1 then "\($ov): ingress rule with \((.ports // []) | length) ports, want the metrics port only"
                 elif (.ports[0].port | int) != $metrics then "\($ov): ingress only to the metrics port \($metrics), not \(.ports[0].port)"
                 else empty end),
              (("Ingress", "Egress") as $t
               | if ($np.spec.policyTypes // []) | index([$t]) | not then "\($ov): policyTypes lacks \($t)" else empty end)'
    done
}

# prometheusrule_matches_alerts: the committed PrometheusRule is what the
# generator prints now, and what the overlays deploy carries exactly the
# rule file's groups.
check_prometheusrule_matches_alerts() {
    local rules=$root/config/alerts/idemproc.rules.yml
    if ! sh "$k8s/gen-prometheusrule.sh" --check >"$work/gen.out" 2>&1; then
        echo "deploy/k8s/components/monitoring/prometheusrule.yaml is stale: run deploy/k8s/gen-prometheusrule.sh ($(grep -v '^\(---\|+++\) ' "$work/gen.out" | head -n 6 | paste -sd '|' | sed 's/|/ | /g'))"
    fi
    # Independently of the generator: the rule file is one YAML mapping, so
    # a header turns it into an object kubectl reads.
    {
        printf 'apiVersion: test.idemproc.io/v1\nkind: Rules\nmetadata:\n  name: rules\n'
        cat "$rules"
    } >"$work/rules.yaml"
    if ! yaml_to_json "$work/rules.yaml" "$work/rules.json" 2>"$work/rules.err"; then
        echo "config/alerts/idemproc.rules.yml does not parse: $(tr '\n' ' ' <"$work/rules.err")"
        return 0
    fi
    if [ "$(jq '.[0].groups | length' "$work/rules.json")" = 0 ]; then
        echo "config/alerts/idemproc.rules.yml has no groups"
    fi
    for ov in "${overlays[@]}"; do
        jqr "$ov" '
            if obj("PrometheusRule"; "idemproc").spec.groups != $rules[0][0].groups
            then "\($ov): the deployed PrometheusRule differs from config/alerts/idemproc.rules.yml" else empty end' \
            --slurpfile rules "$work/rules.json"
    done
}

# member_id_from_pod_name: member.id is the client id and the lease owner;
# the pod name is unique and tells which pod holds a lease.
check_member_id_from_pod_name() {
    for ov in "${overlays[@]}"; do
        jqr "$ov" '
            [container(processor; "idemproc").env[]? | select(.name == "IDEMPROC_MEMBER_ID")] as $e
            | if $e == [] then "\($ov): IDEMPROC_MEMBER_ID not set from the Downward API"
              else $e[] | .valueFrom.fieldRef.fieldPath as $f
                | if $f != "metadata.name" then "\($ov): IDEMPROC_MEMBER_ID from \($f | show), want metadata.name" else empty end
              end'
    done
}

# pod_environment_is_known_keys: every IDEMPROC_* variable of a pod running
# the image must name a configuration key (the binary exits 2 on unknown
# ones), and so would the Service link variables Kubernetes injects for
# Services named idemproc-*, unless the pod turns them off.
check_pod_environment_is_known_keys() {
    for ov in "${overlays[@]}" dev+outbox dev+script dev+webhook dev+redis-cluster; do
        jqr "$ov" '
            def known($known):
                . as $v
                | any($known.keys | keys[]; envname == $v or ($known.file and envname + "_FILE" == $v))
                  or any($known.prefixes[]; envname as $p | $v | startswith($p) and length > ($p | length));
            [.[] | select(.kind == "Service") | .metadata.name | select(startswith("idemproc-"))] as $links
            | .[] | select(.kind == "Deployment" or .kind == "Job") | .metadata.name as $name
            | .spec.template.spec as $pod
            | $pod.containers[]? | select(.image // "" | contains("idemproc"))
            | (if $pod.enableServiceLinks != false
               then "\($ov) \($name): enableServiceLinks must be false (Services \($links | join(", ")) would inject IDEMPROC_* variables)"
               else empty end),
              (.env[]?.name | select(startswith("IDEMPROC_")) | select(known($known) | not)
               | "\($ov) \($name): \(.) names no configuration key")'
    done
}

# production_credentials_from_secret_files: production reads its
# credentials from the mounted Secret; every *.file key names a key of
# base/secret.example.yaml under the credentials mount, and the Secret is
# required. (That the values arrive is the end-to-end test's part.)
check_production_credentials_from_secret_files() {
    if ! yaml_to_json "$k8s/base/secret.example.yaml" "$work/secret.json" 2>"$work/secret.err"; then
        echo "base/secret.example.yaml does not parse: $(tr '\n' ' ' <"$work/secret.err")"
        return 0
    fi
    jqr production '
        processor as $d | container($d; "idemproc") as $c
        | mount($c; "credentials") as $mount
        | (conf_text($d; $c) | props) as $p
        | ($secret[0][0].stringData // {} | keys) as $secret_keys
        | volume($d; "credentials") as $vol
        | if $mount == null then "production: the credentials volume is not mounted" else
            (("redis.password.file", "kafka.sasl.password.file", "kafka.sasl.username.file", "redis.tls.ca.file") as $k
             | $p[$k] as $v
             | if ($v // "" | startswith($mount + "/")) | not then "production: \($k)=\($v | show) is not under the Secret mount \($mount)"
               elif $secret_keys | index([$v | ltrimstr($mount + "/")]) | not
               then "production: \($k)=\($v) names no key of base/secret.example.yaml"
               else empty end),
            (if $vol.secret.secretName != "idemproc-credentials" then "production: credentials volume is Secret \($vol.secret.secretName | show), want idemproc-credentials" else empty end),
            (if $vol.secret.optional != false then "production: must not start without its credentials (secret.optional false)" else empty end)
          end' --slurpfile secret "$work/secret.json"
}

# outbox_component_renders: the relay Deployment runs `outbox -c` on its
# mounted ConfigMap, reads the DSN from a required Secret, and its
# NetworkPolicy lets it reach PostgreSQL. (check-config --for outbox on
# that configuration is the end-to-end test's part.)
check_outbox_component_renders() {
    if [ ! -f "$work/dev+outbox.json" ]; then
        echo "dev+outbox: kubectl kustomize failed: $(tr '\n' ' ' <"$work/dev+outbox.err")"
        return 0
    fi
    local example=$k8s/components/outbox/secret.example.yaml
    if ! yaml_to_json "$example" "$work/outbox-secret.json" 2>"$work/outbox-secret.err"; then
        echo "components/outbox/secret.example.yaml does not parse: $(tr '\n' ' ' <"$work/outbox-secret.err")"
        return 0
    fi
    jqr dev+outbox '
        obj("Deployment"; "idemproc-outbox") as $d | container($d; "outbox") as $c
        | $d.spec.template.spec as $pod
        | mount($c; "config") as $cm_mount
        | if processor == null then "the processor is gone" else empty end,
          if $d == null then "no idemproc-outbox Deployment"
          elif $c == null then "no container outbox"
          else
            (if $c.args != ["outbox", "-c", "\($cm_mount)/outbox.properties"]
             then "args \($c.args | tojson), want [\"outbox\",\"-c\",\"\($cm_mount)/outbox.properties\"]" else empty end),
            (if $pod.securityContext.runAsNonRoot != true then "runAsNonRoot" else empty end),
            (if $pod.enableServiceLinks != false then "enableServiceLinks must be false" else empty end),
            (if $c.securityContext.readOnlyRootFilesystem != true then "readOnlyRootFilesystem" else empty end),
            (if $c.readinessProbe.httpGet.path != "/readyz" then "readinessProbe path \($c.readinessProbe.httpGet.path | show), want /readyz" else empty end),
            (if $c.livenessProbe.httpGet.path != "/healthz" then "livenessProbe path \($c.livenessProbe.httpGet.path | show), want /healthz" else empty end),
            (obj("ConfigMap"; volume($d; "config").configMap.name).data["outbox.properties"] as $props
             | if $props == null then "the mounted ConfigMap (outbox.properties) is not rendered" else
                 (if $props | contains("http.listen=0.0.0.0:9464") | not then "outbox.properties does not listen on 0.0.0.0:9464" else empty end),
                 (if (mount($c; "dsn") // "") as $m | $props | contains($m + "/") | not then "outbox.dsn.file is not in the dsn mount" else empty end)
               end),
            (if $c.ports[0].containerPort? != 9464 then "containerPort \($c.ports[0].containerPort? | show), want 9464" else empty end),
            (volume($d; "dsn") as $sv
             | if $sv == null then "no dsn volume" else
                 (if $sv.secret.optional != null then "the DSN Secret is required (no secret.optional)" else empty end),
                 (if $example[0][0].metadata.name != $sv.secret.secretName
                  then "secret.example.yaml names \($example[0][0].metadata.name | show), the volume \($sv.secret.secretName | show)" else empty end),
                 (if ($example[0][0].stringData.dsn // "") | contains("password=") | not then "the example has no dsn with a password" else empty end)
               end),
            (if count("Secret") != 0 then "the DSN Secret is created out of band, \(count("Secret")) rendered" else empty end),
            (obj("NetworkPolicy"; "idemproc-outbox") as $np
             | if $np == null then "no NetworkPolicy idemproc-outbox" else
                 (if $np.spec.podSelector.matchLabels["app.kubernetes.io/component"] != $d.spec.template.metadata.labels["app.kubernetes.io/component"]
                  then "NetworkPolicy idemproc-outbox does not select the relay pods" else empty end),
                 (if any($np.spec.egress[]?.ports[]?; .port | int == 5432) | not then "egress to PostgreSQL (5432) is not allowed" else empty end)
               end)
          end' --slurpfile example "$work/outbox-secret.json"
}

# ---- running them ----------------------------------------------------------

checks=(
    "overlays render|check_overlays_render"
    "dockerfile structure|check_dockerfile_structure"
    "pod security and limits|check_pod_security_and_limits"
    "probes match http.listen|check_probes_match_http_listen"
    "grace period covers shutdown|check_grace_period_covers_shutdown"
    "replicas bounded by partitions|check_replicas_bounded_by_partitions"
    "dev topics and traffic match config|check_dev_topics_and_traffic_match_config"
    "networkpolicy allows only needed traffic|check_networkpolicy_allows_only_needed_traffic"
    "prometheusrule matches alerts|check_prometheusrule_matches_alerts"
    "member id from pod name|check_member_id_from_pod_name"
    "pod environment is known keys|check_pod_environment_is_known_keys"
    "production credentials from secret files|check_production_credentials_from_secret_files"
    "outbox component renders|check_outbox_component_renders"
)

passed=0 failed=0
for entry in "${checks[@]}"; do
    name=${entry%%|*}
    fn=${entry#*|}
    # In a subshell with errexit on (not in a condition, where bash would
    # ignore it): a command that fails unexpectedly fails the check.
    set +e
    (
        set -e
        "$fn"
    ) >"$work/out" 2>"$work/err"
    rc=$?
    set -e
    why=$(awk '!seen[$0]++' "$work/out" | paste -sd ';' | sed 's/;/; /g')
    if [ "$rc" != 0 ]; then
        why="${why:+$why; }the check stopped (exit $rc): $(tail -n 3 "$work/err" | paste -sd ' ')"
    fi
    if [ -z "$why" ]; then
        echo "ok - $name"
        passed=$((passed + 1))
    else
        echo "not ok - $name: $why"
        failed=$((failed + 1))
    fi
done
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
