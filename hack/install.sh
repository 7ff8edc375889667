#!/usr/bin/env bash
# hack/install.sh — install Kubevisor with a chosen driver set on any cluster (make install,
# make uninstall): by default through kubevisor-operator (manifests/operator and a Kubevisor
# object), or with --no-operator from the kustomize base manifests/install and its driver
# components manifests/install/drivers/<name>.
#
#   hack/install.sh [install] [--drivers qmp,libvirt,cni,local,hostdev] [--kubeconfig FILE] [--tag TAG] [--timeout 5m] [--no-operator]
#   (a --drivers entry NAME:KIND=IMAGE is a driver from its driver image, e.g.
#    sim:device=kubevisor-examples/sim-device:dev, docs/driver-authoring.md; with --no-operator
#    an entry with a "/" is a driver's own kustomize Component directory instead, e.g.
#    examples/sim-device/deploy)
#   hack/install.sh render    [--drivers ...] [--tag TAG]      # print the manifests, apply nothing
#   hack/install.sh uninstall [--kubeconfig FILE] [--timeout 5m]
#
# install applies the operator (its CRD, roles and Deployment, the images at --tag), waits for it,
# then applies the Kubevisor object "kubevisor" with the driver set and the tag, and waits until
# its status says Available at that spec, printing what the operator reports as it goes; a spec
# the operator refuses (a driver unknown, a dropped driver whose class VMIs use) ends it with the
# operator's message, the running install untouched. The operator applies the same manifests as
# --no-operator, prunes what a driver set no longer has (a dropped driver's class), and rolls the
# components out controller, handlers, API.
# --no-operator builds a temporary kustomization (the base plus the chosen components, and the
# image tag), applies it with `kubectl apply --server-side` (CRDs first, then the rest once they
# are established) and waits until kubevisor-controller and kubevisor-api are Available and the
# kubevisor-handler DaemonSet is rolled out on every node. A driver set with a single
# HypervisorClass and no default one makes that class the default; the classes an earlier
# install made that this driver set has not are deleted. uninstall deletes the Kubevisor
# object with uninstallStrategy RemoveWorkloads and waits for the operator to remove everything,
# then the operator; without an operator it deletes the Kubevisor objects (VMs and VMIs first,
# while the controller and webhooks still run to finish them), then the components, then the
# CRDs, and the capability labels the handlers put on nodes.
#
# The kubeconfig is --kubeconfig, else $KUBECONFIG, else the local cluster's
# (_output/cluster/kubeconfig, make up) when it exists, else kubectl's default. --timeout defaults
# to $INSTALL_TIMEOUT, else 5m.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BASE="${ROOT}/manifests/install"
KUBECTL="${KUBECTL:-kubectl}"
NS=kubevisor-system
FIELD_MANAGER=kubevisor-install

die() { echo "install: $*" >&2; exit 1; }
log() { echo "==> install: $*"; }

usage() {
  sed -n '2,16p' "${BASH_SOURCE[0]}" | grep '^#' | sed 's/^# \{0,1\}//'
  exit 2
}

available_drivers() {
  local d names=()
  for d in "${BASE}"/drivers/*/; do
    [[ -f "${d}kustomization.yaml" ]] && names+=("$(basename "${d}")")
  done
  (IFS=,; echo "${names[*]}")
}

action=install
drivers="qmp,libvirt,cni,local,hostdev"
kubeconfig="${KUBECONFIG:-}"
tag=""
timeout="${INSTALL_TIMEOUT:-5m}"
operator=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    install|uninstall|render) action="$1" ;;
    --drivers) drivers="${2-}"; shift ;;
    --drivers=*) drivers="${1#*=}" ;;
    --kubeconfig) kubeconfig="${2-}"; shift ;;
    --kubeconfig=*) kubeconfig="${1#*=}" ;;
    --tag) tag="${2-}"; shift ;;
    --tag=*) tag="${1#*=}" ;;
    --timeout) timeout="${2-}"; shift ;;
    --timeout=*) timeout="${1#*=}" ;;
    --no-operator) operator=0 ;;
    -h|--help) usage ;;
    *) echo "install: unknown argument $1" >&2; usage ;;
  esac
  shift
done

if [[ -z "${kubeconfig}" && -f "${ROOT}/_output/cluster/kubeconfig" ]]; then
  kubeconfig="${ROOT}/_output/cluster/kubeconfig"
fi
k() {
  if [[ -n "${kubeconfig}" ]]; then "${KUBECTL}" --kubeconfig "${kubeconfig}" "$@"; else "${KUBECTL}" "$@"; fi
}

# The chosen components: a name is manifests/install/drivers/<name>; an entry with a "/" is the
# directory of a driver's own component (a third-party driver's, e.g. examples/sim-device/deploy),
# taken from the current directory, else from the repository root.
components=()     # as given, for the log
component_dirs=() # absolute
IFS=, read -r -a wanted <<<"${drivers// /}"
for d in "${wanted[@]}"; do
  [[ -z "${d}" ]] && continue
  if [[ "${d}" == *=* ]]; then
    # NAME:KIND=IMAGE, a driver from its driver image: the operator's spec.drivers entry.
    [[ "${d}" =~ ^([a-z0-9][a-z0-9-]*):(hypervisor|network|storage|device)=(.+)$ ]] ||
      die "driver \"${d}\": a driver from a driver image is NAME:KIND=IMAGE, KIND hypervisor, network, storage or device"
    ((operator)) || die "driver \"${d}\": a driver image is installed through the operator (drop --no-operator), or name its kustomize Component directory"
    components+=("${d}")
    continue
  elif [[ "${d}" == */* ]]; then
    ((operator == 0)) || die "driver component \"${d}\": a driver's kustomize Component directory needs --no-operator; with the operator, name its driver image: NAME:KIND=IMAGE"
    dir=""
    for cand in "${d}" "${ROOT}/${d}"; do
      if [[ -f "${cand}/kustomization.yaml" ]]; then dir="$(cd "${cand}" && pwd)"; break; fi
    done
    [[ -n "${dir}" ]] || die "driver component \"${d}\": no kustomization.yaml there (nor under ${ROOT})"
    grep -q '^kind: Component' "${dir}/kustomization.yaml" \
      || die "driver component \"${d}\": ${dir}/kustomization.yaml is not a kustomize Component (kind: Component)"
  elif [[ "${d}" =~ ^[a-z0-9][a-z0-9-]*$ && -f "${BASE}/drivers/${d}/kustomization.yaml" ]]; then
    dir="${BASE}/drivers/${d}"
  else
    die "unknown driver \"${d}\"; available drivers: $(available_drivers) (manifests/install/drivers), or a driver image NAME:KIND=IMAGE (with --no-operator: the directory of a driver's component, a path with a /)"
  fi
  for c in "${component_dirs[@]}"; do [[ "${c}" == "${dir}" ]] && die "driver \"${d}\" is named twice"; done
  components+=("${d}")
  component_dirs+=("${dir}")
done

work="$(mktemp -d "${TMPDIR:-/tmp}/kubevisor-install.XXXXXX")"
trap 'rm -rf "${work}"' EXIT

# render writes the full installation to ${work}/install.yaml and the CRDs to ${work}/crds.yaml.
render() {
  local rel c
  for c in "${components[@]}"; do
    [[ "${c}" != *=* ]] || die "render prints the kustomize install (--no-operator); the driver image ${c} is the operator's to add"
  done
  rel="$(realpath --relative-to="${work}" "${BASE}")" # kustomize takes no absolute roots
  {
    echo "# Made by hack/install.sh: the Kubevisor base and the chosen driver components."
    echo "apiVersion: kustomize.config.k8s.io/v1beta1"
    echo "kind: Kustomization"
    echo "resources:"
    echo "- ${rel}"
    if [[ ${#components[@]} -gt 0 ]]; then
      echo "components:"
      for c in "${component_dirs[@]}"; do echo "- $(realpath --relative-to="${work}" "${c}")"; done
    fi
    if [[ -n "${tag}" ]]; then
      echo "images:"
      for i in kubevisor-controller kubevisor-api kubevisor-handler kubevisor-launcher; do
        echo "- name: kubevisor/${i}"
        echo "  newTag: ${tag}"
      done
    fi
    # The driver components' objects (their HypervisorClasses) carry the base's label too:
    # install finds by it the classes a previous install made and this one no longer wants.
    echo "labels:"
    echo "- pairs:"
    echo "    app.kubernetes.io/part-of: kubevisor"
    echo "  includeSelectors: false"
  } >"${work}/kustomization.yaml"
  # The base includes the generated manifests of manifests/webhook and manifests/rbac, which
  # are files outside its directory.
  "${KUBECTL}" kustomize "${work}" >"${work}/install.yaml" \
    || die "kustomize failed (kustomization: ${work}/kustomization.yaml)"
  # A driver set with one hypervisor driver whose class is not the default (libvirt alone, say):
  # that only class becomes the default, so that VMIs naming no class (KubeVirt's manifests)
  # run. With several classes, the qmp component's is the default, or none.
  local classes defaults
  classes=$(grep -c '^kind: HypervisorClass$' "${work}/install.yaml" || true)
  defaults=$(grep -c '^    hypervisorclass.kubevisor.io/is-default-class: "true"$' "${work}/install.yaml" || true)
  if [[ "${classes}" == 1 && "${defaults}" == 0 ]]; then
    cat >>"${work}/kustomization.yaml" <<'PATCH'
patches:
- target:
    kind: HypervisorClass
  patch: |-
    - op: add
      path: /metadata/annotations
      value:
        hypervisorclass.kubevisor.io/is-default-class: "true"
PATCH
    "${KUBECTL}" kustomize "${work}" >"${work}/install.yaml" \
      || die "kustomize failed (kustomization: ${work}/kustomization.yaml)"
  fi
  "${KUBECTL}" kustomize "${ROOT}/manifests/crd" >"${work}/crds.yaml"
  # Everything but the CRDs, which uninstall deletes last.
  awk 'function flush() { if (doc != "" && doc !~ /\nkind: CustomResourceDefinition\n/) printf "%s", doc; doc = "" }
       /^---$/ { flush(); doc = "---\n"; next } { doc = doc $0 "\n" } END { flush() }' \
    <(printf -- '---\n'; cat "${work}/install.yaml") >"${work}/components.yaml"
}

diagnose() {
  echo "--- pods in ${NS}:" >&2
  k -n "${NS}" get pods -o wide >&2 || true
  local p
  for p in $(k -n "${NS}" get pods -o name 2>/dev/null); do
    echo "--- ${p}:" >&2
    k -n "${NS}" describe "${p}" | sed -n '/^Conditions:/,$p' | tail -25 >&2 || true
    k -n "${NS}" logs "${p}" --all-containers --tail=20 >&2 || true
  done
  if k -n "${NS}" get events -o jsonpath='{.items[*].message}' 2>/dev/null | grep -q 'but it is not a shared mount'; then
    echo "install: the handler's /run/kubevisor is mounted Bidirectional (containerDisk disks), which needs a" >&2
    echo "install: shared mount on the node (systemd nodes have one); on a node whose / is private, run there:" >&2
    echo "install:   mkdir -p /run/kubevisor && mount --bind /run/kubevisor /run/kubevisor && mount --make-rshared /run/kubevisor" >&2
  fi
}

install() {
  local start=${SECONDS}
  render
  log "drivers: ${components[*]:-(none)}; kubeconfig: ${kubeconfig:-kubectl default}"
  warn_devices
  k version >/dev/null 2>&1 || die "the cluster does not answer (kubeconfig: ${kubeconfig:-kubectl default})"
  check_dropped
  log "CRDs"
  k apply --server-side --force-conflicts --field-manager="${FIELD_MANAGER}" -f "${work}/crds.yaml" >/dev/null
  k wait --for condition=Established --timeout="${timeout}" -f "${work}/crds.yaml" >/dev/null
  log "applying $(grep -c '^kind:' "${work}/install.yaml") objects"
  k apply --server-side --force-conflicts --field-manager="${FIELD_MANAGER}" -f "${work}/install.yaml"
  prune_classes
  log "waiting for kubevisor-controller, kubevisor-api (Available) and kubevisor-handler (rolled out), at most ${timeout}"
  local ok=1 d
  for d in kubevisor-controller kubevisor-api; do
    k -n "${NS}" rollout status "deployment/${d}" --timeout="${timeout}" || ok=0
    k -n "${NS}" wait --for condition=Available --timeout="${timeout}" "deployment/${d}" >/dev/null || ok=0
  done
  k -n "${NS}" rollout status daemonset/kubevisor-handler --timeout="${timeout}" || ok=0
  if [[ ${ok} -ne 1 ]]; then
    diagnose
    die "Kubevisor did not become ready within ${timeout}"
  fi
  log "installed in $((SECONDS - start))s"
  k -n "${NS}" get deployments,daemonsets
  k get hypervisorclasses 2>/dev/null || true
}

# prune_classes deletes the HypervisorClasses an earlier install made (labelled part-of
# kubevisor) that this driver set has not: a dropped driver's class would leave its VMIs
# admitted for a driver no handler loads. Classes an admin made are not labelled and stay.
prune_classes() {
  local c
  for c in $(dropped_classes); do
    log "deleting hypervisorclass ${c}: its driver is not in this driver set"
    k delete hypervisorclass "${c}" --ignore-not-found >/dev/null
  done
}

# dropped_classes lists the classes an earlier install made that this driver set has not.
dropped_classes() {
  local want c
  want=" $(awk '/^kind: HypervisorClass$/ { c = 1 } /^---$/ { c = 0 } c && /^  name: / { printf "%s ", $2 }' "${work}/install.yaml")"
  for c in $(k get hypervisorclasses -l app.kubernetes.io/part-of=kubevisor -o name 2>/dev/null || true); do
    [[ "${want}" == *" ${c#*/} "* ]] || echo "${c#*/}"
  done
}

# warn_devices says when the classes of this driver set request device resources
# (deviceResources, e.g. devices.kubevisor.io/kvm) and the set has no device driver that could
# serve them (hostdev, or a driver's own component): their VMIs would stay Pending, the scheduler
# saying the node has none of the resource.
warn_devices() {
  local c resources
  for c in "${components[@]}"; do [[ "${c}" == hostdev || "${c}" == */* ]] && return 0; done
  resources=$(awk 'function flush() { if (hvc) printf "%s", res; hvc = 0; res = "" }
    /^---$/ { flush() } /^kind: HypervisorClass$/ { hvc = 1 } /^- devices\.kubevisor\.io\// { res = res $2 " " }
    END { flush() }' "${work}/install.yaml" | tr ' ' '\n' | sort -u | tr '\n' ' ')
  [[ -z "${resources}" ]] && return 0
  echo "install: warning: the HypervisorClasses request ${resources}but no device driver is in --drivers (add hostdev): their VMIs will stay Pending" >&2
}

# check_dropped refuses, before anything is applied, a driver set that drops the class of VMIs
# that exist: their handler would no longer load their driver, and a running VM would be left
# without anyone to manage it. The admin deletes (or stops) them first, or keeps the driver.
check_dropped() {
  local c vmis bad=0
  for c in $(dropped_classes); do
    vmis=$(k get vmi -A --no-headers -o custom-columns=NS:.metadata.namespace,NAME:.metadata.name,SPEC:.spec.hypervisorClassName,STATUS:.status.hypervisorClassName 2>/dev/null \
      | awk -v c="${c}" '$3 == c || $4 == c { printf "%s/%s ", $1, $2 }' || true)
    if [[ -n "${vmis// /}" ]]; then
      echo "install: the driver set drops HypervisorClass ${c}, but these VMIs run with it: ${vmis}" >&2
      bad=1
    fi
  done
  [[ ${bad} == 0 ]] || die "nothing applied: stop those VMs (or delete the VMIs) first, or keep their driver in --drivers"
}

uninstall() {
  local start=${SECONDS} kind
  render
  if k get crd virtualmachineinstances.kubevisor.io >/dev/null 2>&1; then
    # Owners first (the VMI controller finishes VMIs, and admission still answers the
    # finalizer updates), while the components still run.
    for kind in virtualmachines virtualmachineinstancereplicasets virtualmachineinstancemigrations virtualmachineinstances; do
      log "deleting every ${kind}"
      k delete "${kind}.kubevisor.io" --all --all-namespaces --ignore-not-found --wait --timeout="${timeout}" \
        || echo "install: some ${kind} did not go within ${timeout}; going on" >&2
    done
  fi
  log "deleting the components"
  k delete --ignore-not-found --wait --timeout="${timeout}" -f "${work}/components.yaml" || true
  log "deleting the CRDs"
  k delete --ignore-not-found --wait --timeout="${timeout}" -f "${work}/crds.yaml" || true
  # The handlers' capability labels (capability.kubevisor.io/*, kubevisor.io/schedulable).
  local node labels
  for node in $(k get nodes -o name 2>/dev/null); do
    labels=$(k get "${node}" -o go-template='{{range $k, $v := .metadata.labels}}{{$k}}{{"\n"}}{{end}}' \
      | grep -E '^(capability\.kubevisor\.io/|kubevisor\.io/)' | sed 's/$/-/' || true)
    if [[ -n "${labels}" ]]; then
      # shellcheck disable=SC2086
      k label "${node}" ${labels} >/dev/null
    fi
  done
  log "uninstalled in $((SECONDS - start))s (node directories /run/kubevisor and /var/lib/kubevisor are left)"
}

# ---- through kubevisor-operator ----

KV=kubevisor # the Kubevisor object's name

# kv_json prints the Kubevisor object as JSON, or nothing when there is none.
kv_json() { k get kubevisors.kubevisor.io "${KV}" -o json 2>/dev/null || true; }

# kv_state prints "generation observedGeneration available progressing degraded-reason" and,
# on the next lines, the Progressing and the Degraded messages.
kv_state() {
  jq -r '(.status.conditions // []) as $c
    | ([.metadata.generation, (.status.observedGeneration // 0),
        ($c | map(select(.type == "Available"))[0].status // "Unknown"),
        ($c | map(select(.type == "Progressing"))[0].status // "Unknown"),
        ($c | map(select(.type == "Degraded" and .status == "True"))[0].reason // "-")] | map(tostring) | join(" ")),
      ($c | map(select(.type == "Progressing"))[0].message // ""),
      ($c | map(select(.type == "Degraded"))[0].message // "")'
}

install_operator() {
  local start=${SECONDS} rel c
  command -v jq >/dev/null || die "jq is needed (make deps-tools installs it)"
  log "drivers: ${components[*]:-(none)}; kubeconfig: ${kubeconfig:-kubectl default}; through kubevisor-operator"
  k version >/dev/null 2>&1 || die "the cluster does not answer (kubeconfig: ${kubeconfig:-kubectl default})"
  rel="$(realpath --relative-to="${work}" "${ROOT}/manifests/operator")"
  {
    echo "# Made by hack/install.sh: kubevisor-operator."
    echo "apiVersion: kustomize.config.k8s.io/v1beta1"
    echo "kind: Kustomization"
    echo "resources:"
    echo "- ${rel}"
    if [[ -n "${tag}" ]]; then
      echo "images:"
      echo "- name: kubevisor/kubevisor-operator"
      echo "  newTag: ${tag}"
    fi
  } >"${work}/kustomization.yaml"
  "${KUBECTL}" kustomize "${work}" >"${work}/operator.yaml" || die "kustomize failed (kustomization: ${work}/kustomization.yaml)"
  log "kubevisor-operator$([[ -n "${tag}" ]] && echo " ${tag}")"
  k apply --server-side --force-conflicts --field-manager="${FIELD_MANAGER}" -f "${work}/operator.yaml" >/dev/null
  k wait --for condition=Established --timeout="${timeout}" crd/kubevisors.kubevisor.io >/dev/null
  if ! k -n "${NS}" rollout status deployment/kubevisor-operator --timeout="${timeout}" >/dev/null; then
    diagnose
    die "kubevisor-operator did not become ready within ${timeout}"
  fi
  # The Kubevisor object, applied with this script's field manager: drivers dropped from the
  # list leave the spec.
  {
    echo "apiVersion: kubevisor.io/v1alpha1"
    echo "kind: Kubevisor"
    echo "metadata:"
    echo "  name: ${KV}"
    echo "spec:"
    [[ -n "${tag}" ]] && echo "  imageTag: ${tag}"
    # The gated features the repository's e2e suite uses (hostDisk volumes and hostDevices in
    # conformance/e2e/driverimages.go); off by default, as in KubeVirt (docs/operator.md).
    echo "  configuration:"
    echo "    featureGates: [HostDisk, HostDevices]"
    echo "  drivers:"
    for c in "${components[@]}"; do
      if [[ "${c}" =~ ^([^:]+):([^=]+)=(.+)$ ]]; then
        printf '  - name: %s
    kind: %s
    image: %s
' "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}" "${BASH_REMATCH[3]}"
      else
        printf '  - name: %s
' "${c}"
      fi
    done
  } >"${work}/kubevisor.yaml"
  log "Kubevisor ${KV}: applying"
  k apply --server-side --force-conflicts --field-manager="${FIELD_MANAGER}" -f "${work}/kubevisor.yaml" >/dev/null
  # Until the operator reports this spec Available and done, saying what it does as it goes.
  local deadline=$((SECONDS + $(timeout_seconds))) state gen obs avail prog degraded pmsg dmsg last=""
  while :; do
    state="$(kv_json | kv_state)"
    pmsg="" dmsg=""
    { read -r gen obs avail prog degraded; read -r pmsg || true; read -r dmsg || true; } <<<"${state}"
    if [[ "${gen}" == "${obs}" ]]; then
      case "${degraded}" in
        InvalidSpec|DriverInUse) die "the operator refuses the driver set (${degraded}): ${dmsg}" ;;
      esac
      [[ "${avail}" == True && "${prog}" == False ]] && break
      if [[ -n "${pmsg}" && "${pmsg}" != "${last}" ]]; then
        log "operator: ${pmsg}$([[ "${degraded}" != - ]] && echo " (${degraded}: ${dmsg})")"
        last="${pmsg}"
      fi
    fi
    if ((SECONDS >= deadline)); then
      diagnose
      die "Kubevisor did not become Available within ${timeout}: ${pmsg:-no status}${dmsg:+; ${dmsg}}"
    fi
    sleep 2
  done
  log "installed in $((SECONDS - start))s"
  k get kubevisors.kubevisor.io "${KV}"
  k -n "${NS}" get deployments,daemonsets
  k get hypervisorclasses 2>/dev/null || true
}

# timeout_seconds prints --timeout (5m, 300s, 1h) in seconds.
timeout_seconds() {
  case "${timeout}" in
    *h) echo $((${timeout%h} * 3600)) ;;
    *m) echo $((${timeout%m} * 60)) ;;
    *s) echo "${timeout%s}" ;;
    *) echo "${timeout}" ;;
  esac
}

uninstall_operator() {
  local start=${SECONDS} deadline
  log "Kubevisor ${KV}: uninstallStrategy RemoveWorkloads, deleting it (the operator deletes the VMs, then what it made)"
  k patch kubevisors.kubevisor.io "${KV}" --type merge -p '{"spec":{"uninstallStrategy":"RemoveWorkloads"}}' >/dev/null
  k delete kubevisors.kubevisor.io "${KV}" --wait=false >/dev/null
  deadline=$((SECONDS + $(timeout_seconds)))
  while [[ -n "$(kv_json)" ]]; do
    if ((SECONDS >= deadline)); then
      die "the operator did not finish the uninstall within ${timeout}: $(kv_json | kv_state | sed -n 2p)"
    fi
    sleep 2
  done
  log "deleting kubevisor-operator"
  "${KUBECTL}" kustomize "${ROOT}/manifests/operator" >"${work}/operator.yaml"
  k delete --ignore-not-found --wait --timeout="${timeout}" -f "${work}/operator.yaml" >/dev/null || true
  log "uninstalled in $((SECONDS - start))s (node directories /run/kubevisor and /var/lib/kubevisor are left)"
}

case "${action}" in
  render) render; cat "${work}/install.yaml" ;;
  install) if ((operator)); then install_operator; else install; fi ;;
  uninstall) if [[ -n "$(kv_json)" ]]; then uninstall_operator; else uninstall; fi ;;
esac
