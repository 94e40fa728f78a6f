/* test_deploy: the container build (deploy/docker) and the Kubernetes
 * manifests (deploy/k8s), checked against the binary itself: kustomize
 * renders every overlay, and the rendered configuration and environment
 * must pass `idemproc check-config` as the pod would run it. */
#include "harness.h"

#include <criterion/criterion.h>
#include <ctype.h>
#include <jansson.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* kubectl as found on PATH (these machines ship it in /usr/bin). */
static char *kubectl(void)
{
    static char found[PATH_MAX];
    if (found[0])
        return found;
    const char *path = getenv("PATH");
    char *dirs = strdup(path ? path : "/usr/bin:/bin");
    char *rest = dirs;
    for (char *d = strsep(&rest, ":"); d; d = strsep(&rest, ":")) {
        snprintf(found, sizeof(found), "%s/kubectl", *d ? d : ".");
        if (access(found, X_OK) == 0)
            break;
        found[0] = '\0';
    }
    free(dirs);
    cr_assert(found[0], "kubectl is not on PATH");
    return found;
}
TestSuite(deploy, .fini = th_stack_cleanup);

#define POD_NAME "idemproc-5f7c9d8b6-x2x7q" /* what metadata.name gives */

static const char *const overlays[] = {"dev", "production", NULL};

/* ---- small helpers ---------------------------------------------------- */

/* Absolute path of a file in the source tree; caller frees. */
static char *src_path(const char *rel)
{
    char root[PATH_MAX];
    if (!realpath(th_src(), root))
        cr_assert_fail("IDEMPROC_SRC %s: cannot resolve", th_src());
    size_t size = strlen(root) + strlen(rel) + 2;
    char *p = malloc(size);
    snprintf(p, size, "%s/%s", root, rel);
    return p;
}

static char *write_file(const char *dir, const char *name, const char *text)
{
    char *path = malloc(PATH_MAX);
    snprintf(path, PATH_MAX, "%s/%s", dir, name);
    FILE *fp = fopen(path, "w");
    cr_assert(fp, "cannot write %s", path);
    fputs(text, fp);
    fclose(fp);
    return path;
}

/* Follows a path of object keys; "#N" indexes an array. Borrowed result,
 * NULL when any step is missing. */
static json_t *jget(json_t *o, ...)
{
    va_list ap;
    va_start(ap, o);
    for (const char *k = va_arg(ap, const char *); k && o;
         k = va_arg(ap, const char *)) {
        if (k[0] == '#')
            o = json_array_get(o, (size_t)atoi(k + 1));
        else
            o = json_object_get(o, k);
    }
    va_end(ap);
    return o;
}

#define JGET(o, ...) jget((o), __VA_ARGS__, (const char *)NULL)

static const char *jstr(json_t *o)
{
    return json_is_string(o) ? json_string_value(o) : NULL;
}

static int jtrue(json_t *o)
{
    return json_is_true(o);
}

/* Integer of a JSON number or of a numeric string (annotations). */
static long long jint(json_t *o)
{
    if (json_is_integer(o))
        return json_integer_value(o);
    if (json_is_string(o))
        return atoll(json_string_value(o));
    return -1;
}

/* Parses a stream of JSON documents (what kubectl prints for several
 * objects); a "List" contributes its items. New reference. */
static json_t *parse_objects(const char *text)
{
    json_t *all = json_array();
    size_t len = strlen(text), off = 0;
    while (off < len) {
        while (off < len && isspace((unsigned char)text[off]))
            off++;
        if (off >= len)
            break;
        json_error_t e;
        json_t *o =
            json_loadb(text + off, len - off, JSON_DISABLE_EOF_CHECK, &e);
        cr_assert(o, "kubectl JSON at byte %zu: %s", off, e.text);
        off += (size_t)e.position;
        if (!strcmp(jstr(JGET(o, "kind")) ? jstr(JGET(o, "kind")) : "",
                    "List")) {
            json_array_extend(all, JGET(o, "items"));
            json_decref(o);
        } else {
            json_array_append_new(all, o);
        }
    }
    return all;
}

/* YAML file -> JSON objects, offline: `kubectl annotate --local` parses
 * the manifests without a cluster (built-in kinds and CRDs alike) and can
 * print JSON, which jansson reads. */
static json_t *yaml_file_to_json(const char *path)
{
    char *argv[] = {kubectl(),    "annotate", "--local", "-f",
                    (char *)path, "-o",       "json",    "idemproc.io/parsed=1",
                    NULL};
    char *out = NULL, *err = NULL;
    int rc = th_run(argv, &out, &err, 60000);
    cr_assert_eq(rc, 0, "kubectl annotate --local %s: %s", path, err);
    json_t *objs = parse_objects(out);
    free(out);
    free(err);
    return objs;
}

/* Renders a kustomization directory; returns its objects. */
static json_t *render_dir(const char *dir)
{
    char *argv[] = {kubectl(), "kustomize", (char *)dir, NULL};
    char *out = NULL, *err = NULL;
    int rc = th_run(argv, &out, &err, 60000);
    cr_assert_eq(rc, 0, "kubectl kustomize %s failed (%d): %s", dir, rc, err);
    cr_assert(out && *out, "kubectl kustomize %s: empty output", dir);
    char *tmp = th_tmpdir();
    char *path = write_file(tmp, "rendered.yaml", out);
    json_t *objs = yaml_file_to_json(path);
    th_rmrf(tmp);
    free(tmp);
    free(path);
    free(out);
    free(err);
    return objs;
}

static json_t *render_overlay(const char *overlay)
{
    char rel[256];
    snprintf(rel, sizeof(rel), "deploy/k8s/overlays/%s", overlay);
    char *dir = src_path(rel);
    json_t *objs = render_dir(dir);
    free(dir);
    return objs;
}

/* The dev overlay with the optional KEDA component, through a throwaway
 * kustomization (kustomize refuses absolute paths, hence ../..). */
static json_t *render_dev_with_keda(void)
{
    char *tmp = th_tmpdir();
    char *dev = src_path("deploy/k8s/overlays/dev");
    char *keda = src_path("deploy/k8s/components/keda");
    cr_assert(!strncmp(tmp, "/tmp/", 5) && !strchr(tmp + 5, '/'));
    char text[3 * PATH_MAX];
    snprintf(text, sizeof(text),
             "apiVersion: kustomize.config.k8s.io/v1beta1\n"
             "kind: Kustomization\n"
             "resources:\n  - ../..%s\ncomponents:\n  - ../..%s\n",
             dev, keda);
    free(write_file(tmp, "kustomization.yaml", text));
    json_t *objs = render_dir(tmp);
    th_rmrf(tmp);
    free(tmp);
    free(dev);
    free(keda);
    return objs;
}

/* First object of `kind` whose name is `name` (or starts with it when
 * prefix is set; any name when NULL). Borrowed. */
static json_t *find_obj(json_t *objs, const char *kind, const char *name,
                        int prefix)
{
    size_t i;
    json_t *o;
    json_array_foreach(objs, i, o)
    {
        const char *k = jstr(JGET(o, "kind"));
        const char *n = jstr(JGET(o, "metadata", "name"));
        if (!k || strcmp(k, kind))
            continue;
        if (!name || (n && (prefix ? !strncmp(n, name, strlen(name))
                                   : !strcmp(n, name))))
            return o;
    }
    return NULL;
}

static size_t count_kind(json_t *objs, const char *kind)
{
    size_t i, n = 0;
    json_t *o;
    json_array_foreach(objs, i, o)
    {
        const char *k = jstr(JGET(o, "kind"));
        if (k && !strcmp(k, kind))
            n++;
    }
    return n;
}

static json_t *processor(json_t *objs)
{
    json_t *d = find_obj(objs, "Deployment", "idemproc", 0);
    cr_assert(d, "no Deployment idemproc in the rendered overlay");
    return d;
}

static json_t *container_named(json_t *workload, const char *name)
{
    size_t i;
    json_t *c;
    json_array_foreach(JGET(workload, "spec", "template", "spec", "containers"),
                       i, c)
    {
        if (!strcmp(jstr(JGET(c, "name")), name))
            return c;
    }
    cr_assert_fail("no container %s", name);
    return NULL;
}

/* The value of `key=` in a properties text; NULL when absent. Caller
 * frees. */
static char *prop_get(const char *props, const char *key)
{
    size_t kl = strlen(key);
    for (const char *l = props; l && *l;) {
        const char *nl = strchr(l, '\n');
        size_t ll = nl ? (size_t)(nl - l) : strlen(l);
        while (ll && isspace((unsigned char)*l)) {
            l++;
            ll--;
        }
        if (ll > kl && !strncmp(l, key, kl)) {
            const char *r = l + kl;
            while (r < l + ll && (*r == ' ' || *r == '\t'))
                r++;
            if (*r == '=') {
                r++;
                while (r < l + ll && isspace((unsigned char)*r))
                    r++;
                size_t vl = (size_t)(l + ll - r);
                while (vl && isspace((unsigned char)r[vl - 1]))
                    vl--;
                return strndup(r, vl);
            }
        }
        l = nl ? nl + 1 : NULL;
    }
    return NULL;
}

/* Replaces every occurrence of `from` in s by `to`. New string. */
static char *replace_all(const char *s, const char *from, const char *to)
{
    size_t fl = strlen(from), tl = strlen(to), n = 0;
    for (const char *p = strstr(s, from); p; p = strstr(p + fl, from))
        n++;
    char *out = malloc(strlen(s) + n * (tl > fl ? tl - fl : 0) + 1);
    char *w = out;
    for (const char *p; (p = strstr(s, from));) {
        memcpy(w, s, (size_t)(p - s));
        w += p - s;
        memcpy(w, to, tl);
        w += tl;
        s = p + fl;
    }
    strcpy(w, s);
    return out;
}

static const char *const secret_dummy[] = {"test-secret-redis-password",
                                           "test-secret-kafka-sasl-password"};

/* ---- the configuration a pod of `workload` would run with ----------- */

typedef struct {
    char *dir;   /* temp dir: properties and fake secret files */
    char *conf;  /* effective configuration printed by check-config */
    char *err;   /* its stderr */
    int rc;      /* check-config exit code */
    char *props; /* the ConfigMap's properties, as rendered */
} pod_conf_t;

static void pod_conf_free(pod_conf_t *pc)
{
    th_rmrf(pc->dir);
    free(pc->dir);
    free(pc->conf);
    free(pc->err);
    free(pc->props);
}

static const char *mount_path(json_t *c, const char *volume)
{
    size_t i;
    json_t *m;
    json_array_foreach(JGET(c, "volumeMounts"), i, m)
    {
        if (!strcmp(jstr(JGET(m, "name")), volume))
            return jstr(JGET(m, "mountPath"));
    }
    return NULL;
}

static json_t *volume_named(json_t *workload, const char *name)
{
    size_t i;
    json_t *v;
    json_array_foreach(JGET(workload, "spec", "template", "spec", "volumes"), i,
                       v)
    {
        if (!strcmp(jstr(JGET(v, "name")), name))
            return v;
    }
    return NULL;
}

/* Runs `idemproc check-config` the way the pod runs `idemproc run`: the
 * container's args (run -> check-config, -c pointing at the rendered
 * ConfigMap), its environment (Downward API values filled in), the Service
 * link variables Kubernetes would inject unless enableServiceLinks is
 * false, and the Secret mounted at the credentials mount point (here a temp
 * dir with one file per key of base/secret.example.yaml, since the real
 * paths do not exist on this machine). */
/* A pod to start for real instead of checking its configuration: the
 * properties keys to point at this machine's broker and Redis, the
 * working directory, and where its stderr goes. */
typedef struct {
    const char *const *overrides; /* "key=value" lines replacing the file's */
    const char *cwd;
    const char *log;
    pid_t pid; /* out */
} pod_run_t;

static char *props_override(const char *props, const char *const *overrides)
{
    char *out = strdup(props);
    for (int i = 0; overrides && overrides[i]; i++) {
        const char *eq = strchr(overrides[i], '=');
        size_t kl = (size_t)(eq - overrides[i]);
        size_t n = strlen(out) + strlen(overrides[i]) + 2;
        char *next = malloc(n);
        next[0] = '\0';
        int found = 0;
        char *save = NULL;
        for (char *line = strtok_r(out, "\n", &save); line;
             line = strtok_r(NULL, "\n", &save)) {
            if (!strncmp(line, overrides[i], kl) &&
                (line[kl] == '=' || line[kl] == ' ')) {
                line = (char *)overrides[i];
                found = 1;
            }
            strcat(next, line);
            strcat(next, "\n");
        }
        if (!found) {
            strcat(next, overrides[i]);
            strcat(next, "\n");
        }
        free(out);
        out = next;
    }
    return out;
}

static void pod_prepare(json_t *objs, json_t *workload, const char *cname,
                        pod_conf_t *pc, pod_run_t *run)
{
    memset(pc, 0, sizeof(*pc));
    pc->dir = th_tmpdir();
    json_t *pod = JGET(workload, "spec", "template", "spec");
    json_t *c = container_named(workload, cname);

    /* The ConfigMap mounted as the config volume. */
    json_t *cv = volume_named(workload, "config");
    cr_assert(cv, "no config volume");
    const char *cm_name = jstr(JGET(cv, "configMap", "name"));
    json_t *cm = find_obj(objs, "ConfigMap", cm_name, 0);
    cr_assert(cm, "ConfigMap %s (mounted) is not rendered", cm_name);
    const char *props = jstr(JGET(cm, "data", "idemproc.properties"));
    cr_assert(props, "ConfigMap %s has no idemproc.properties", cm_name);
    pc->props = strdup(props);
    const char *cm_mount = mount_path(c, "config");
    cr_assert(cm_mount, "config volume not mounted");

    /* Secret files. */
    char secrets[PATH_MAX];
    snprintf(secrets, sizeof(secrets), "%s/secrets/", pc->dir);
    cr_assert_eq(mkdir(secrets, 0700), 0);
    char *example = src_path("deploy/k8s/base/secret.example.yaml");
    json_t *ex = yaml_file_to_json(example);
    free(example);
    const char *key;
    json_t *val;
    json_object_foreach(JGET(ex, "#0", "stringData"), key, val)
    {
        char body[256];
        snprintf(body, sizeof(body), "test-secret-%s\n", key);
        free(write_file(secrets, key, body));
    }
    json_decref(ex);
    const char *sec_mount = mount_path(c, "credentials");
    char sec_prefix[PATH_MAX] = "/nonexistent-mount/";
    if (sec_mount)
        snprintf(sec_prefix, sizeof(sec_prefix), "%s/", sec_mount);

    char *rewritten = replace_all(props, sec_prefix, secrets);
    if (run) {
        char *o = props_override(rewritten, run->overrides);
        free(rewritten);
        rewritten = o;
    }
    char *conf_path = write_file(pc->dir, "idemproc.properties", rewritten);
    free(rewritten);

    /* Environment. */
    char *env[128];
    int en = 0;
    env[en++] = strdup("PATH=/usr/bin:/bin");
    size_t i;
    json_t *e;
    json_array_foreach(JGET(c, "env"), i, e)
    {
        const char *name = jstr(JGET(e, "name"));
        const char *value = jstr(JGET(e, "value"));
        const char *field = jstr(JGET(e, "valueFrom", "fieldRef", "fieldPath"));
        char buf[1024];
        if (value) {
            char *v = replace_all(value, sec_prefix, secrets);
            snprintf(buf, sizeof(buf), "%s=%s", name, v);
            free(v);
        } else if (field && !strcmp(field, "metadata.name")) {
            snprintf(buf, sizeof(buf), "%s=%s", name, POD_NAME);
        } else if (field && !strcmp(field, "metadata.namespace")) {
            snprintf(buf, sizeof(buf), "%s=%s", name, "test-namespace");
        } else {
            cr_assert_fail("env %s: this test cannot fill in its valueFrom",
                           name);
        }
        cr_assert_lt(en, 120);
        env[en++] = strdup(buf);
    }
    if (!json_is_false(JGET(pod, "enableServiceLinks"))) {
        json_t *o;
        json_array_foreach(objs, i, o)
        {
            const char *k = jstr(JGET(o, "kind"));
            if (!k || strcmp(k, "Service"))
                continue;
            char up[256];
            const char *n = jstr(JGET(o, "metadata", "name"));
            size_t j = 0;
            for (; n[j] && j + 1 < sizeof(up); j++)
                up[j] = n[j] == '-' ? '_' : (char)toupper((unsigned char)n[j]);
            up[j] = '\0';
            long long port = jint(JGET(o, "spec", "ports", "#0", "port"));
            char buf[512];
            snprintf(buf, sizeof(buf), "%s_SERVICE_HOST=10.96.0.10", up);
            env[en++] = strdup(buf);
            snprintf(buf, sizeof(buf), "%s_PORT=tcp://10.96.0.10:%lld", up,
                     port);
            env[en++] = strdup(buf);
            cr_assert_lt(en, 120);
        }
    }
    env[en] = NULL;

    /* Arguments: the container's, with run -> check-config. */
    json_t *args = JGET(c, "args");
    cr_assert(json_array_size(args) >= 1 &&
                  !strcmp(jstr(JGET(args, "#0")), "run"),
              "container args must start with run");
    char *argv[64];
    int an = 0;
    argv[an++] = (char *)th_bin();
    argv[an++] = run ? "run" : "check-config";
    char cm_file[PATH_MAX];
    snprintf(cm_file, sizeof(cm_file), "%s/idemproc.properties", cm_mount);
    int saw_c = 0;
    for (size_t k = 1; k < json_array_size(args) && an < 60; k++) {
        const char *a = jstr(json_array_get(args, k));
        if (!strcmp(a, "-c") || !strcmp(a, "--config")) {
            const char *p = jstr(json_array_get(args, ++k));
            cr_assert(p && !strcmp(p, cm_file),
                      "-c %s is not the mounted ConfigMap file %s", p, cm_file);
            argv[an++] = "-c";
            argv[an++] = conf_path;
            saw_c = 1;
        } else {
            argv[an++] = (char *)a;
        }
    }
    argv[an] = NULL;
    cr_assert(saw_c, "container args have no -c FILE");

    if (run)
        run->pid = th_spawn_in(run->cwd, argv, NULL, run->log, env);
    else
        pc->rc = th_run_env(argv, env, &pc->conf, &pc->err, 30000);
    for (int k = 0; k < en; k++)
        free(env[k]);
    free(conf_path);
}

static void pod_conf_load(json_t *objs, json_t *workload, const char *cname,
                          pod_conf_t *pc)
{
    pod_prepare(objs, workload, cname, pc, NULL);
}

/* Loads the processor's effective configuration and asserts it is valid. */
static void processor_conf(json_t *objs, const char *overlay, pod_conf_t *pc)
{
    pod_conf_load(objs, processor(objs), "idemproc", pc);
    cr_assert_eq(pc->rc, 0, "%s: check-config rejects the pod's config: %s",
                 overlay, pc->err);
}

/* ---- the image ------------------------------------------------------ */

/* A Dockerfile instruction: continuation lines joined, comments dropped. */
typedef struct {
    char op[16];
    char *arg;
    int stage; /* 0-based index of the FROM it belongs to */
} insn_t;

static size_t dockerfile_parse(insn_t *out, size_t max)
{
    char *path = src_path("deploy/docker/Dockerfile");
    char *text = th_slurp(path, NULL);
    cr_assert(text, "cannot read %s", path);
    free(path);
    size_t n = 0;
    int stage = -1;
    char *logical = NULL;
    size_t ll = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        char *s = line;
        while (isspace((unsigned char)*s))
            s++;
        if (*s == '#' || !*s)
            continue;
        size_t l = strlen(s);
        int cont = l && s[l - 1] == '\\';
        if (cont)
            s[--l] = '\0';
        logical = realloc(logical, ll + l + 2);
        memcpy(logical + ll, s, l);
        ll += l;
        logical[ll++] = ' ';
        logical[ll] = '\0';
        if (cont)
            continue;
        cr_assert_lt(n, max);
        insn_t *in = &out[n++];
        size_t ol = strcspn(logical, " \t");
        snprintf(in->op, sizeof(in->op), "%.*s", (int)ol, logical);
        for (char *c = in->op; *c; c++)
            *c = (char)toupper((unsigned char)*c);
        char *a = logical + ol;
        while (isspace((unsigned char)*a))
            a++;
        in->arg = strdup(a);
        size_t al = strlen(in->arg);
        while (al && isspace((unsigned char)in->arg[al - 1]))
            in->arg[--al] = '\0';
        if (!strcmp(in->op, "FROM"))
            stage++;
        in->stage = stage;
        ll = 0;
    }
    free(logical);
    free(text);
    return n;
}

/* Removes all whitespace (JSON-form instructions compare that way). */
static void squeeze(char *s)
{
    char *w = s;
    for (; *s; s++)
        if (!isspace((unsigned char)*s))
            *w++ = *s;
    *w = '\0';
}

Test(deploy, dockerfile_structure)
{
    insn_t in[128];
    size_t n = dockerfile_parse(in, 128);
    int last = in[n - 1].stage;
    int from = 0, user = 0, entry = 0, cmd = 0, expose = 0;
    int run_deps = 0, run_build = 0, run_check = 0, run_runtime = 0;
    const char *labels[] = {"org.opencontainers.image.title",
                            "org.opencontainers.image.description",
                            "org.opencontainers.image.version",
                            "org.opencontainers.image.source", NULL};
    int label_seen[4] = {0};
    for (size_t i = 0; i < n; i++) {
        const char *op = in[i].op;
        char *a = in[i].arg;
        if (!strcmp(op, "FROM")) {
            if (in[i].stage == 0)
                cr_expect(!strcasecmp(a, "debian:bookworm AS build"),
                          "first stage must be FROM debian:bookworm AS build, "
                          "got %s",
                          a);
            if (in[i].stage == last)
                cr_expect_str_eq(a, "debian:bookworm-slim");
            from++;
        } else if (!strcmp(op, "RUN")) {
            /* Packages and the build go through build.sh, the part of
             * the image this machine can test. */
            if (strstr(a, "apt-get") || strstr(a, "make "))
                cr_expect(strstr(a, "build.sh") && !strstr(a, "apt-get") &&
                              !strstr(a, "make "),
                          "RUN installs or builds without build.sh: %s", a);
            if (in[i].stage == 0) {
                run_deps |= strstr(a, "build.sh deps") != NULL;
                run_build |= strstr(a, "build.sh build") != NULL;
                run_check |= strstr(a, "build.sh check-runtime") != NULL;
            } else if (in[i].stage == last) {
                run_runtime |= strstr(a, "build.sh runtime-deps") != NULL;
            }
        } else if (!strcmp(op, "USER") && in[i].stage == last) {
            char *end;
            long uid = strtol(a, &end, 10);
            cr_expect(end != a && (*end == '\0' || *end == ':'),
                      "USER must be numeric (runAsNonRoot can only verify "
                      "a number): %s",
                      a);
            cr_expect_eq(uid, 10001, "USER %s, want 10001", a);
            user = 1;
        } else if (!strcmp(op, "ENTRYPOINT") && in[i].stage == last) {
            squeeze(a);
            cr_expect_str_eq(a, "[\"idemproc\"]");
            entry = 1;
        } else if (!strcmp(op, "CMD") && in[i].stage == last) {
            squeeze(a);
            cr_expect_str_eq(
                a, "[\"run\",\"-c\",\"/etc/idemproc/idemproc.properties\"]");
            cmd = 1;
        } else if (!strcmp(op, "EXPOSE") && in[i].stage == last) {
            expose |= strstr(a, "9464") != NULL;
        } else if (!strcmp(op, "LABEL") && in[i].stage == last) {
            for (int l = 0; labels[l]; l++)
                label_seen[l] |= strstr(a, labels[l]) != NULL;
        } else if (!strcmp(op, "ENV")) {
            /* The processor rejects unknown IDEMPROC_* variables. */
            cr_expect_null(strstr(a, "IDEMPROC_"), "ENV %s", a);
        }
    }
    cr_expect_geq(from, 2, "multi-stage build expected");
    cr_expect(user, "final stage has no USER");
    cr_expect(entry && cmd, "final stage needs ENTRYPOINT and CMD");
    cr_expect(expose, "EXPOSE 9464 missing");
    cr_expect(run_deps && run_build && run_check,
              "build stage must RUN build.sh deps, build and check-runtime");
    cr_expect(run_runtime, "runtime stage must RUN build.sh runtime-deps");
    for (int l = 0; labels[l]; l++)
        cr_expect(label_seen[l], "LABEL %s missing", labels[l]);
    for (size_t i = 0; i < n; i++)
        free(in[i].arg);
}

/* The runtime stage installs exactly what the binary links: each NEEDED
 * library's Debian package (dpkg -S) must be in build.sh's list. */
Test(deploy, runtime_packages_cover_linked_libraries)
{
    char *script = src_path("deploy/docker/build.sh");
    char *argv[] = {"/bin/sh", script, "check-runtime", (char *)th_bin(), NULL};
    char *out = NULL, *err = NULL;
    int rc = th_run(argv, &out, &err, 60000);
    cr_expect_eq(rc, 0, "build.sh check-runtime %s: %s%s", th_bin(), out, err);
    cr_expect(strstr(out, "librdkafka.so.1 librdkafka1"), "%s", out);
    free(out);
    free(err);

    char *argv2[] = {"/bin/sh", script, "runtime-packages", NULL};
    rc = th_run(argv2, &out, NULL, 10000);
    cr_assert_eq(rc, 0);
    /* Only runtime packages: no compiler or headers in the slim image. */
    cr_expect_null(strstr(out, "-dev"), "%s", out);
    cr_expect_null(strstr(out, "build-essential"), "%s", out);
    cr_expect(strstr(out, "ca-certificates\n"), "TLS to Kafka needs CAs: %s",
              out);
    free(out);
    free(script);
}

/* What the Dockerfile's build stage runs, run here into a temp DESTDIR
 * (and a temp object dir, so the work tree's build/ is not touched). */
Test(deploy, build_script_installs_runnable_binary, .timeout = 600)
{
    char *tmp = th_tmpdir();
    char *script = src_path("deploy/docker/build.sh");
    char destdir[PATH_MAX], builddir[PATH_MAX], bin[2 * PATH_MAX];
    snprintf(destdir, sizeof(destdir), "%s/root", tmp);
    snprintf(builddir, sizeof(builddir), "BUILD_DIR=%s/build", tmp);
    snprintf(bin, sizeof(bin), "%s/usr/local/bin/idemproc", destdir);
    char path_env[4096];
    snprintf(path_env, sizeof(path_env), "PATH=%s",
             getenv("PATH") ? getenv("PATH") : "/usr/bin:/bin");
    char *env[] = {path_env, builddir, "JOBS=2", "LC_ALL=C", NULL};
    char *argv[] = {"/bin/sh", script, "build", destdir, NULL};
    char *out = NULL, *err = NULL;
    int rc = th_run_env(argv, env, &out, &err, 590000);
    cr_assert_eq(rc, 0, "build.sh build failed (%d):\n%s\n%s", rc, out, err);
    cr_expect(strstr(out, "runtime packages:"), "%s", out);
    free(out);
    free(err);

    char *argv2[] = {bin, "--version", NULL};
    rc = th_run(argv2, &out, &err, 10000);
    cr_expect_eq(rc, 0, "%s --version: %s", bin, err);
    cr_expect(!strncmp(out, "idemproc ", 9), "%s", out);
    free(out);
    free(err);

    char *argv3[] = {"/bin/sh", script, "check-runtime", bin, NULL};
    rc = th_run(argv3, &out, &err, 60000);
    cr_expect_eq(rc, 0, "check-runtime: %s%s", out, err);
    free(out);
    free(err);
    free(script);
    th_rmrf(tmp);
    free(tmp);
}

/* ---- the manifests -------------------------------------------------- */

Test(deploy, overlays_render, .timeout = 120)
{
    for (int i = 0; overlays[i]; i++) {
        json_t *objs = render_overlay(overlays[i]);
        const char *ov = overlays[i];
        cr_expect(find_obj(objs, "Deployment", "idemproc", 0), "%s", ov);
        cr_expect(find_obj(objs, "ConfigMap", "idemproc-config-", 1), "%s", ov);
        cr_expect(find_obj(objs, "Service", "idemproc-metrics", 0), "%s", ov);
        cr_expect(find_obj(objs, "NetworkPolicy", "idemproc", 0), "%s", ov);
        cr_expect(find_obj(objs, "ServiceMonitor", "idemproc", 0), "%s", ov);
        cr_expect(find_obj(objs, "PrometheusRule", "idemproc", 0), "%s", ov);
        cr_expect(find_obj(objs, "HorizontalPodAutoscaler", "idemproc", 0),
                  "%s", ov);
        json_t *pdb = find_obj(objs, "PodDisruptionBudget", "idemproc", 0);
        cr_expect_eq(jint(JGET(pdb, "spec", "maxUnavailable")), 1, "%s", ov);
        if (!strcmp(ov, "dev")) {
            cr_expect_geq(count_kind(objs, "KafkaTopic"), 2);
            cr_expect(find_obj(objs, "Deployment", "idemproc-redis", 0));
            cr_expect(find_obj(objs, "Service", "idemproc-redis", 0));
            cr_expect(find_obj(objs, "Job", "idemproc-traffic", 0));
        } else {
            /* Test traffic and a throwaway Redis never reach production. */
            cr_expect_eq(count_kind(objs, "Job"), 0);
            cr_expect_null(find_obj(objs, "Deployment", "idemproc-redis", 0));
            cr_expect_eq(count_kind(objs, "Secret"), 0,
                         "production Secrets are created out of band");
        }
        json_decref(objs);
    }
    json_t *keda = render_dev_with_keda();
    cr_expect(find_obj(keda, "ScaledObject", "idemproc", 0));
    cr_expect_eq(count_kind(keda, "HorizontalPodAutoscaler"), 0,
                 "KEDA owns the HPA; the base one must be removed");
    json_decref(keda);
}

Test(deploy, configmap_passes_check_config, .timeout = 120)
{
    for (int i = 0; overlays[i]; i++) {
        json_t *objs = render_overlay(overlays[i]);
        pod_conf_t pc;
        processor_conf(objs, overlays[i], &pc);
        cr_expect(strstr(pc.conf, "member.id=" POD_NAME "\n"),
                  "%s: member.id is not the pod name:\n%s", overlays[i],
                  pc.conf);
        for (size_t k = 0; k < 2; k++)
            cr_expect_null(strstr(pc.conf, secret_dummy[k]),
                           "%s: secret printed:\n%s", overlays[i], pc.conf);
        pod_conf_free(&pc);
        json_decref(objs);
    }
}

/* Production reads its credentials from the mounted Secret: every *.file
 * key names a key of the Secret under the credentials mount, and the
 * values really arrive (check-config shows the non-secret username). */
Test(deploy, production_credentials_from_secret_files, .timeout = 120)
{
    json_t *objs = render_overlay("production");
    pod_conf_t pc;
    processor_conf(objs, "production", &pc);
    const char *want[] = {"redis.password.file", "kafka.sasl.password.file",
                          "kafka.sasl.username.file", NULL};
    json_t *c = container_named(processor(objs), "idemproc");
    const char *mount = mount_path(c, "credentials");
    cr_assert(mount);
    for (int k = 0; want[k]; k++) {
        char *v = prop_get(pc.props, want[k]);
        cr_expect(v && !strncmp(v, mount, strlen(mount)),
                  "%s=%s is not under the Secret mount %s", want[k], v, mount);
        free(v);
    }
    json_t *vol = volume_named(processor(objs), "credentials");
    cr_expect_str_eq(jstr(JGET(vol, "secret", "secretName")),
                     "idemproc-credentials");
    cr_expect(json_is_false(JGET(vol, "secret", "optional")),
              "production must not start without its credentials");
    cr_expect(strstr(pc.conf, "kafka.security.protocol=SASL_SSL\n"), "%s",
              pc.conf);
    cr_expect(strstr(pc.conf, "kafka.sasl.username=test-secret-"), "%s",
              pc.conf);
    cr_expect(strstr(pc.conf, "redis.password=[redacted]\n"), "%s", pc.conf);
    cr_expect(strstr(pc.conf, "kafka.sasl.password=[redacted]\n"), "%s",
              pc.conf);
    /* Redis: TLS with verification, an ACL user, the CA from the Secret. */
    cr_expect(strstr(pc.conf, "redis.url=rediss://"), "%s", pc.conf);
    cr_expect(strstr(pc.conf, "redis.tls.verify=true\n"), "%s", pc.conf);
    cr_expect(strstr(pc.conf, "redis.username=idemproc\n"), "%s", pc.conf);
    char *ca = prop_get(pc.props, "redis.tls.ca.file");
    cr_expect(ca && !strncmp(ca, mount, strlen(mount)),
              "redis.tls.ca.file=%s is not under the Secret mount %s", ca,
              mount);
    free(ca);
    pod_conf_free(&pc);
    json_decref(objs);
}

/* Every IDEMPROC_* variable a pod gets must be a configuration key: the
 * processor exits 2 on unknown ones. That includes the Service link
 * variables Kubernetes injects for Services named idemproc-*, unless the
 * pod turns them off. */
Test(deploy, pod_environment_is_known_keys, .timeout = 120)
{
    for (int i = 0; overlays[i]; i++) {
        json_t *objs = render_overlay(overlays[i]);
        size_t k;
        json_t *o;
        json_array_foreach(objs, k, o)
        {
            const char *kind = jstr(JGET(o, "kind"));
            if (strcmp(kind, "Deployment") && strcmp(kind, "Job"))
                continue;
            json_t *pod = JGET(o, "spec", "template", "spec");
            size_t j;
            json_t *c;
            json_array_foreach(JGET(pod, "containers"), j, c)
            {
                const char *image = jstr(JGET(c, "image"));
                if (!strstr(image, "idemproc"))
                    continue;
                cr_expect(json_is_false(JGET(pod, "enableServiceLinks")),
                          "%s %s: enableServiceLinks must be false",
                          overlays[i], jstr(JGET(o, "metadata", "name")));
                const char *cmd = jstr(JGET(c, "args", "#0"));
                if (!cmd || strcmp(cmd, "run"))
                    continue; /* produce: no configuration file */
                pod_conf_t pc;
                pod_conf_load(objs, o, jstr(JGET(c, "name")), &pc);
                cr_expect_eq(pc.rc, 0, "%s %s: %s", overlays[i],
                             jstr(JGET(o, "metadata", "name")), pc.err);
                pod_conf_free(&pc);
            }
        }
        json_decref(objs);
    }
}

Test(deploy, member_id_from_pod_name)
{
    json_t *objs = render_overlay("dev");
    json_t *c = container_named(processor(objs), "idemproc");
    size_t i;
    json_t *e;
    int found = 0;
    json_array_foreach(JGET(c, "env"), i, e)
    {
        if (!strcmp(jstr(JGET(e, "name")), "IDEMPROC_MEMBER_ID")) {
            cr_expect_str_eq(
                jstr(JGET(e, "valueFrom", "fieldRef", "fieldPath")),
                "metadata.name");
            found = 1;
        }
    }
    cr_expect(found, "IDEMPROC_MEMBER_ID not set from the Downward API");
    json_decref(objs);
}

/* Resolves a probe's or Service's port (a name or a number) against the
 * container's ports. */
static long long container_port(json_t *c, json_t *port)
{
    if (json_is_integer(port))
        return json_integer_value(port);
    size_t i;
    json_t *p;
    json_array_foreach(JGET(c, "ports"), i, p)
    {
        if (jstr(port) && !strcmp(jstr(JGET(p, "name")), jstr(port)))
            return jint(JGET(p, "containerPort"));
    }
    return -1;
}

static long long listen_port(const char *conf, char **host)
{
    char *listen = prop_get(conf, "http.listen");
    cr_assert(listen && *listen, "http.listen is empty: no probes possible");
    char *colon = strrchr(listen, ':');
    cr_assert(colon, "http.listen=%s has no port", listen);
    *colon = '\0';
    long long port = atoll(colon + 1);
    *host = listen;
    return port;
}

Test(deploy, probes_match_http_listen, .timeout = 120)
{
    for (int i = 0; overlays[i]; i++) {
        const char *ov = overlays[i];
        json_t *objs = render_overlay(ov);
        pod_conf_t pc;
        processor_conf(objs, ov, &pc);
        char *host;
        long long port = listen_port(pc.conf, &host);
        cr_expect(!strcmp(host, "0.0.0.0") || !strcmp(host, "[::]") || !*host,
                  "%s: http.listen host %s: the kubelet probes the pod IP", ov,
                  host);
        free(host);
        json_t *c = container_named(processor(objs), "idemproc");
        struct {
            const char *probe, *path;
        } probes[] = {{"startupProbe", "/healthz"},
                      {"livenessProbe", "/healthz"},
                      {"readinessProbe", "/readyz"}};
        for (int p = 0; p < 3; p++) {
            json_t *g = JGET(c, probes[p].probe, "httpGet");
            cr_expect(g, "%s: no %s.httpGet", ov, probes[p].probe);
            cr_expect_str_eq(jstr(JGET(g, "path")), probes[p].path, "%s %s", ov,
                             probes[p].probe);
            cr_expect_eq(container_port(c, JGET(g, "port")), port,
                         "%s %s: port is not http.listen's %lld", ov,
                         probes[p].probe, port);
        }
        json_t *svc = find_obj(objs, "Service", "idemproc-metrics", 0);
        json_t *sp = JGET(svc, "spec", "ports", "#0");
        cr_expect_eq(container_port(c, JGET(sp, "targetPort")), port, "%s", ov);
        json_t *sm = find_obj(objs, "ServiceMonitor", "idemproc", 0);
        cr_expect_str_eq(jstr(JGET(sm, "spec", "endpoints", "#0", "port")),
                         jstr(JGET(sp, "name")), "%s", ov);
        cr_expect_str_eq(jstr(JGET(sm, "spec", "endpoints", "#0", "path")),
                         "/metrics");
        /* The ServiceMonitor and Service select the processor's pods. */
        json_t *labels =
            JGET(processor(objs), "spec", "template", "metadata", "labels");
        const char *lk;
        json_t *lv;
        json_object_foreach(JGET(svc, "spec", "selector"), lk, lv)
            cr_expect_str_eq(jstr(json_object_get(labels, lk)), jstr(lv),
                             "%s: Service selector %s", ov, lk);
        json_object_foreach(JGET(sm, "spec", "selector", "matchLabels"), lk, lv)
            cr_expect_str_eq(
                jstr(JGET(svc, "metadata", "labels", lk)), jstr(lv),
                "%s: ServiceMonitor selector %s does not match the Service", ov,
                lk);
        pod_conf_free(&pc);
        json_decref(objs);
    }
}

Test(deploy, pod_security_and_limits, .timeout = 120)
{
    for (int i = 0; overlays[i]; i++) {
        const char *ov = overlays[i];
        json_t *objs = render_overlay(ov);
        size_t k;
        json_t *o;
        json_array_foreach(objs, k, o)
        {
            const char *kind = jstr(JGET(o, "kind"));
            if (strcmp(kind, "Deployment") && strcmp(kind, "Job"))
                continue;
            const char *name = jstr(JGET(o, "metadata", "name"));
            json_t *pod = JGET(o, "spec", "template", "spec");
            json_t *psc = JGET(pod, "securityContext");
            cr_expect(json_is_false(JGET(pod, "automountServiceAccountToken")),
                      "%s %s: no API access needed", ov, name);
            size_t j;
            json_t *c;
            json_array_foreach(JGET(pod, "containers"), j, c)
            {
                json_t *sc = JGET(c, "securityContext");
                cr_expect(jtrue(JGET(sc, "runAsNonRoot")) ||
                              jtrue(JGET(psc, "runAsNonRoot")),
                          "%s %s: runAsNonRoot", ov, name);
                const char *sp = jstr(JGET(sc, "seccompProfile", "type"));
                if (!sp)
                    sp = jstr(JGET(psc, "seccompProfile", "type"));
                cr_expect(sp && !strcmp(sp, "RuntimeDefault"),
                          "%s %s: seccompProfile RuntimeDefault", ov, name);
                cr_expect(json_is_false(JGET(sc, "allowPrivilegeEscalation")),
                          "%s %s: allowPrivilegeEscalation false", ov, name);
                cr_expect(jtrue(JGET(sc, "readOnlyRootFilesystem")),
                          "%s %s: readOnlyRootFilesystem", ov, name);
                cr_expect_str_eq(jstr(JGET(sc, "capabilities", "drop", "#0")),
                                 "ALL", "%s %s: capabilities drop ALL", ov,
                                 name);
                const char *res[] = {"requests", "limits"};
                const char *kinds[] = {"cpu", "memory"};
                for (int r = 0; r < 2; r++)
                    for (int m = 0; m < 2; m++)
                        cr_expect(JGET(c, "resources", res[r], kinds[m]),
                                  "%s %s: resources.%s.%s", ov, name, res[r],
                                  kinds[m]);
                if (!strstr(jstr(JGET(c, "image")), "idemproc"))
                    continue;
                long long uid = jint(JGET(sc, "runAsUser"));
                if (uid < 0)
                    uid = jint(JGET(psc, "runAsUser"));
                cr_expect_eq(uid, 10001, "%s %s: runAsUser", ov, name);
                /* A read-only root needs a writable /tmp. */
                size_t m;
                json_t *vm;
                int tmp_ok = 0;
                json_array_foreach(JGET(c, "volumeMounts"), m, vm)
                {
                    if (strcmp(jstr(JGET(vm, "mountPath")), "/tmp"))
                        continue;
                    json_t *v = volume_named(o, jstr(JGET(vm, "name")));
                    tmp_ok = JGET(v, "emptyDir") != NULL;
                }
                cr_expect(tmp_ok, "%s %s: /tmp must be an emptyDir", ov, name);
            }
        }
        json_t *d = processor(objs);
        cr_expect(JGET(d, "spec", "template", "spec",
                       "topologySpreadConstraints", "#0"),
                  "%s: topologySpreadConstraints", ov);
        cr_expect(JGET(container_named(d, "idemproc"), "lifecycle", "preStop"),
                  "%s: preStop hook", ov);
        cr_expect_null(JGET(d, "spec", "replicas"),
                       "%s: replicas belong to the autoscaler", ov);
        json_decref(objs);
    }
}

/* The pod must get the time to run preStop and then shut down cleanly:
 * terminationGracePeriodSeconds covers both, or the kubelet SIGKILLs the
 * processor mid-commit (safe, but the records are re-read). */
Test(deploy, grace_period_covers_shutdown, .timeout = 120)
{
    for (int i = 0; overlays[i]; i++) {
        json_t *objs = render_overlay(overlays[i]);
        pod_conf_t pc;
        processor_conf(objs, overlays[i], &pc);
        char *st = prop_get(pc.conf, "shutdown.timeout.ms");
        long long shutdown_ms = atoll(st);
        free(st);
        json_t *d = processor(objs);
        long long grace = jint(JGET(d, "spec", "template", "spec",
                                    "terminationGracePeriodSeconds"));
        json_t *pre =
            JGET(container_named(d, "idemproc"), "lifecycle", "preStop");
        long long pre_ms = 0;
        if (JGET(pre, "sleep", "seconds"))
            pre_ms = jint(JGET(pre, "sleep", "seconds")) * 1000;
        else if (jstr(JGET(pre, "exec", "command", "#0")) &&
                 !strcmp(jstr(JGET(pre, "exec", "command", "#0")), "sleep"))
            pre_ms = atoll(jstr(JGET(pre, "exec", "command", "#1"))) * 1000;
        cr_expect_gt(grace * 1000, shutdown_ms,
                     "%s: terminationGracePeriodSeconds %lld <= "
                     "shutdown.timeout.ms %lld",
                     overlays[i], grace, shutdown_ms);
        cr_expect_gt(grace * 1000, shutdown_ms + pre_ms,
                     "%s: grace %lld s does not cover preStop %lld ms + "
                     "shutdown %lld ms",
                     overlays[i], grace, pre_ms, shutdown_ms);
        pod_conf_free(&pc);
        json_decref(objs);
    }
}

static json_t *kafka_topic(json_t *objs, const char *topic)
{
    size_t i;
    json_t *o;
    json_array_foreach(objs, i, o)
    {
        if (strcmp(jstr(JGET(o, "kind")), "KafkaTopic"))
            continue;
        const char *name = jstr(JGET(o, "spec", "topicName"));
        if (!name)
            name = jstr(JGET(o, "metadata", "name"));
        if (!strcmp(name, topic))
            return o;
    }
    return NULL;
}

/* Replicas beyond the input topic's partition count have nothing to
 * consume. */
Test(deploy, replicas_bounded_by_partitions, .timeout = 120)
{
    for (int i = 0; overlays[i]; i++) {
        const char *ov = overlays[i];
        json_t *objs = render_overlay(ov);
        json_t *hpa = find_obj(objs, "HorizontalPodAutoscaler", "idemproc", 0);
        long long max = jint(JGET(hpa, "spec", "maxReplicas"));
        long long min = jint(JGET(hpa, "spec", "minReplicas"));
        long long parts = jint(JGET(hpa, "metadata", "annotations",
                                    "idemproc.io/input-partitions"));
        cr_expect_gt(parts, 0, "%s: HPA lacks idemproc.io/input-partitions",
                     ov);
        cr_expect_leq(max, parts, "%s: maxReplicas %lld > partitions %lld", ov,
                      max, parts);
        cr_expect(min >= 1 && min <= max, "%s: minReplicas %lld", ov, min);
        if (!strcmp(ov, "dev")) {
            pod_conf_t pc;
            processor_conf(objs, ov, &pc);
            char *topic = prop_get(pc.conf, "input.topics");
            json_t *kt = kafka_topic(objs, topic);
            cr_assert(kt, "dev: no KafkaTopic for input.topics=%s", topic);
            long long kparts = jint(JGET(kt, "spec", "partitions"));
            cr_expect_leq(max, kparts, "dev: maxReplicas %lld > %s has %lld",
                          max, topic, kparts);
            cr_expect_eq(parts, kparts,
                         "dev: the HPA annotation says %lld partitions, the "
                         "KafkaTopic %lld",
                         parts, kparts);
            free(topic);
            pod_conf_free(&pc);
        }
        json_decref(objs);
    }

    json_t *objs = render_dev_with_keda();
    pod_conf_t pc;
    processor_conf(objs, "dev+keda", &pc);
    json_t *so = find_obj(objs, "ScaledObject", "idemproc", 0);
    char *topic = prop_get(pc.conf, "input.topics");
    char *group = prop_get(pc.conf, "group.id");
    char *bootstrap = prop_get(pc.conf, "kafka.bootstrap.servers");
    json_t *kt = kafka_topic(objs, topic);
    cr_expect_leq(jint(JGET(so, "spec", "maxReplicaCount")),
                  jint(JGET(kt, "spec", "partitions")));
    json_t *md = JGET(so, "spec", "triggers", "#0", "metadata");
    cr_expect_str_eq(jstr(JGET(so, "spec", "triggers", "#0", "type")), "kafka");
    cr_expect_str_eq(jstr(JGET(md, "topic")), topic);
    cr_expect_str_eq(jstr(JGET(md, "consumerGroup")), group);
    cr_expect_str_eq(jstr(JGET(md, "bootstrapServers")), bootstrap);
    free(topic);
    free(group);
    free(bootstrap);
    pod_conf_free(&pc);
    json_decref(objs);
}

/* dev is self-contained: its topics (the DLQ too) exist in its Strimzi
 * cluster, the processor and the traffic Job reach that cluster. */
Test(deploy, dev_topics_and_traffic_match_config, .timeout = 120)
{
    json_t *objs = render_overlay("dev");
    pod_conf_t pc;
    processor_conf(objs, "dev", &pc);
    char *topic = prop_get(pc.conf, "input.topics");
    char *dlq = prop_get(pc.conf, "dlq.topic");
    char *bootstrap = prop_get(pc.conf, "kafka.bootstrap.servers");
    json_t *kafka = find_obj(objs, "Kafka", NULL, 0);
    cr_assert(kafka, "dev: no Strimzi Kafka");
    const char *cluster = jstr(JGET(kafka, "metadata", "name"));
    char want[256];
    snprintf(want, sizeof(want), "%s-kafka-bootstrap:%lld", cluster,
             jint(JGET(kafka, "spec", "kafka", "listeners", "#0", "port")));
    cr_expect_str_eq(bootstrap, want);
    const char *topics[] = {topic, dlq};
    for (int t = 0; t < 2; t++) {
        json_t *kt = kafka_topic(objs, topics[t]);
        cr_expect(kt, "dev: no KafkaTopic %s", topics[t]);
        cr_expect_str_eq(
            jstr(JGET(kt, "metadata", "labels", "strimzi.io/cluster")),
            cluster);
    }
    json_t *job = find_obj(objs, "Job", "idemproc-traffic", 0);
    json_t *args =
        JGET(job, "spec", "template", "spec", "containers", "#0", "args");
    cr_expect_str_eq(jstr(JGET(args, "#0")), "produce");
    for (size_t a = 1; a + 1 < json_array_size(args); a++) {
        const char *flag = jstr(json_array_get(args, a));
        const char *v = jstr(json_array_get(args, a + 1));
        if (!strcmp(flag, "-b"))
            cr_expect_str_eq(v, bootstrap);
        if (!strcmp(flag, "-t"))
            cr_expect_str_eq(v, topic);
    }
    char *redis = prop_get(pc.conf, "redis.url");
    cr_expect(strstr(redis, "//idemproc-redis:"),
              "dev: redis.url %s is not the dev Redis Service", redis);
    free(redis);
    free(topic);
    free(dlq);
    free(bootstrap);
    pod_conf_free(&pc);
    json_decref(objs);
}

static int port_listed(long long *ports, size_t n, long long p)
{
    for (size_t i = 0; i < n; i++)
        if (ports[i] == p)
            return 1;
    return 0;
}

/* Egress: DNS, the Kafka ports of kafka.bootstrap.servers and the Redis
 * port of redis.url, nothing else; ingress: the metrics port only. */
Test(deploy, networkpolicy_allows_only_needed_traffic, .timeout = 120)
{
    for (int i = 0; overlays[i]; i++) {
        const char *ov = overlays[i];
        json_t *objs = render_overlay(ov);
        pod_conf_t pc;
        processor_conf(objs, ov, &pc);
        long long need[32];
        size_t nn = 0;
        need[nn++] = 53;
        char *bs = prop_get(pc.conf, "kafka.bootstrap.servers");
        for (char *s = bs, *t; (t = strsep(&s, ","));) {
            char *colon = strrchr(t, ':');
            cr_assert(colon, "%s: bootstrap %s without port", ov, t);
            if (!port_listed(need, nn, atoll(colon + 1)))
                need[nn++] = atoll(colon + 1);
        }
        free(bs);
        char *redis = prop_get(pc.conf, "redis.url");
        long long redis_port = 6379;
        const char *at = strrchr(redis, '@');
        const char *hp = at ? at + 1 : strstr(redis, "//") + 2;
        const char *colon = strchr(hp, ':');
        if (colon)
            redis_port = atoll(colon + 1);
        need[nn++] = redis_port;
        free(redis);

        json_t *np = find_obj(objs, "NetworkPolicy", "idemproc", 0);
        long long allowed[64];
        size_t na = 0;
        size_t r;
        json_t *rule;
        json_array_foreach(JGET(np, "spec", "egress"), r, rule)
        {
            json_t *ports = JGET(rule, "ports");
            cr_expect_gt(json_array_size(ports), 0,
                         "%s: an egress rule without ports allows all", ov);
            size_t p;
            json_t *port;
            json_array_foreach(ports, p, port)
            {
                long long n = jint(JGET(port, "port"));
                if (na < 64)
                    allowed[na++] = n;
                cr_expect(port_listed(need, nn, n),
                          "%s: egress port %lld is not Kafka, Redis or DNS", ov,
                          n);
            }
        }
        for (size_t k = 0; k < nn; k++)
            cr_expect(port_listed(allowed, na, need[k]),
                      "%s: egress to port %lld is needed", ov, need[k]);
        char *host;
        long long metrics = listen_port(pc.conf, &host);
        free(host);
        json_array_foreach(JGET(np, "spec", "ingress"), r, rule)
        {
            json_t *ports = JGET(rule, "ports");
            cr_expect_eq(json_array_size(ports), 1, "%s: ingress", ov);
            cr_expect_eq(jint(JGET(ports, "#0", "port")), metrics,
                         "%s: ingress only to the metrics port", ov);
        }
        const char *types[] = {"Ingress", "Egress"};
        for (int t = 0; t < 2; t++) {
            int seen = 0;
            json_t *pt;
            json_array_foreach(JGET(np, "spec", "policyTypes"), r, pt) seen |=
                !strcmp(jstr(pt), types[t]);
            cr_expect(seen, "%s: policyTypes lacks %s", ov, types[t]);
        }
        pod_conf_free(&pc);
        json_decref(objs);
    }
}

/* The PrometheusRule is generated from config/alerts/idemproc.rules.yml;
 * the committed copy must be what the generator prints now, and what the
 * overlays deploy must carry exactly the rule file's groups. */
Test(deploy, prometheusrule_matches_alerts, .timeout = 120)
{
    char *script = src_path("deploy/k8s/gen-prometheusrule.sh");
    char *argv[] = {"/bin/sh", script, "--check", NULL};
    char *out = NULL, *err = NULL;
    int rc = th_run(argv, &out, &err, 30000);
    cr_expect_eq(rc, 0,
                 "deploy/k8s/components/monitoring/prometheusrule.yaml is "
                 "stale: run deploy/k8s/gen-prometheusrule.sh\n%s%s",
                 out, err);
    free(out);
    free(err);
    free(script);

    /* Independently of the generator: the rule file's groups as JSON (it is
     * one YAML mapping, so a header turns it into an object kubectl reads),
     * compared with the rendered PrometheusRule's spec.groups. */
    char *rules_path = src_path("config/alerts/idemproc.rules.yml");
    char *rules = th_slurp(rules_path, NULL);
    cr_assert(rules, "cannot read %s", rules_path);
    size_t rl = strlen(rules);
    char *doc = malloc(rl + 256);
    snprintf(doc, rl + 256,
             "apiVersion: test.idemproc.io/v1\nkind: Rules\n"
             "metadata:\n  name: rules\n%s",
             rules);
    char *tmp = th_tmpdir();
    char *path = write_file(tmp, "rules.yaml", doc);
    json_t *parsed = yaml_file_to_json(path);
    json_t *groups = JGET(parsed, "#0", "groups");
    cr_assert(json_array_size(groups) > 0, "%s has no groups", rules_path);
    for (int i = 0; overlays[i]; i++) {
        json_t *objs = render_overlay(overlays[i]);
        json_t *pr = find_obj(objs, "PrometheusRule", "idemproc", 0);
        cr_expect(json_equal(JGET(pr, "spec", "groups"), groups),
                  "%s: the deployed PrometheusRule differs from %s",
                  overlays[i], rules_path);
        json_decref(objs);
    }
    json_decref(parsed);
    th_rmrf(tmp);
    free(tmp);
    free(path);
    free(doc);
    free(rules);
    free(rules_path);
}

/* The rehearsal's stack, at file scope so the suite's .fini can stop it
 * after a failed assertion. */
static th_stack_t stk;

/* The pod rehearsal: the processor runs exactly as its container would
 * (arguments, environment with the pod name, configuration only from the
 * mounted ConfigMap file and the Secret files, another working directory)
 * against this machine's broker and Redis; SIGTERM arrives while traffic
 * flows; it must exit 0 within the grace period (less the preStop sleep)
 * without losing anything, and write nothing where it runs. */
Test(deploy, pod_rehearsal_sigterm_during_traffic, .timeout = 240)
{
    json_t *objs = render_overlay("dev");
    json_t *d = processor(objs);
    long long grace = jint(
        JGET(d, "spec", "template", "spec", "terminationGracePeriodSeconds"));
    cr_assert_gt(grace, 0);

    cr_assert_eq(th_stack_start(&stk, 6, NULL), 0);
    char boot[300], redis[128], listen[64];
    snprintf(boot, sizeof(boot), "kafka.bootstrap.servers=%s",
             stk.broker.bootstrap);
    snprintf(redis, sizeof(redis), "redis.url=%s", stk.redis.url);
    /* Tests use 127.0.0.1 only; the pod listens on 0.0.0.0. */
    snprintf(listen, sizeof(listen), "http.listen=127.0.0.1:%d",
             th_free_port());
    const char *overrides[] = {boot,
                               redis,
                               listen,
                               "kafka.fetch.wait.max.ms=10",
                               "kafka.session.timeout.ms=6000",
                               "message.max.bytes=4096",
                               NULL};

    /* Traffic keeps flowing while the pod is stopped. */
    char *pargv[] = {(char *)th_bin(),
                     "produce",
                     "-b",
                     stk.broker.bootstrap,
                     "-t",
                     "payments",
                     "--count",
                     "20000",
                     "--rate",
                     "4000",
                     "--duplicates",
                     "0.1",
                     "--poison",
                     "0.01",
                     "--too-large-bytes",
                     "5000",
                     "--seed",
                     "21",
                     "--expect",
                     stk.expect,
                     NULL};
    pid_t producer = th_spawn(pargv, NULL, NULL, NULL);

    char *cwd = th_tmpdir();
    char log1[600], log2[600];
    snprintf(log1, sizeof(log1), "%s/pod1.log", stk.dir);
    snprintf(log2, sizeof(log2), "%s/pod2.log", stk.dir);
    pod_conf_t pc1, pc2;
    pod_run_t run1 = {.overrides = overrides, .cwd = cwd, .log = log1};
    pod_prepare(objs, d, "idemproc", &pc1, &run1);
    sleep(6); /* joined and busy, traffic still arriving */
    kill(run1.pid, SIGTERM);
    int rc = th_wait(run1.pid, (int)(grace * 1000 - 5000));
    char *l1 = th_slurp(log1, NULL);
    cr_expect_eq(rc, 0, "SIGTERM: exit %d, want 0 within %lld s:\n%.2000s", rc,
                 grace - 5, l1 ? l1 : "");
    cr_expect(l1 && strstr(l1, "stopped cleanly"), "no clean stop");
    free(l1);
    if (rc < 0)
        th_stop(run1.pid, 1000);

    /* The next pod takes over; together nothing is lost or doubled. */
    pod_run_t run2 = {.overrides = overrides, .cwd = cwd, .log = log2};
    pod_prepare(objs, d, "idemproc", &pc2, &run2);
    cr_expect_eq(th_wait(producer, 60000), 0, "produce failed");
    char *vout = NULL;
    /* verify as the pods' group: the DLQ is filtered by dlq.group. */
    char *group = prop_get(pc1.props, "group.id");
    char gset[256];
    snprintf(gset, sizeof(gset), "group.id=%s", group);
    free(group);
    const char *vsets[] = {gset, NULL};
    int vrc = th_stack_wait_verified(&stk, 1, vsets, 90000, &vout);
    cr_expect_eq(vrc, 0, "after the rehearsal verify is not exact:\n%s", vout);
    free(vout);
    cr_expect_eq(th_stop(run2.pid, (int)(grace * 1000)), 0);

    /* Nothing written where the pod runs (its root file system is
     * read-only; only /tmp is writable). */
    char *lsargv[] = {"/bin/ls", "-A", cwd, NULL};
    char *ls = NULL;
    th_run(lsargv, &ls, NULL, 10000);
    cr_expect_str_eq(ls ? ls : "", "", "the pod wrote into its directory");
    free(ls);
    th_rmrf(cwd);
    free(cwd);
    pod_conf_free(&pc1);
    pod_conf_free(&pc2);
    th_stack_stop(&stk);
    json_decref(objs);
}

/* ---- the outbox relay component ------------------------------------- */

/* The dev overlay with the optional outbox component. */
static json_t *render_dev_with_outbox(void)
{
    char *tmp = th_tmpdir();
    char *dev = src_path("deploy/k8s/overlays/dev");
    char *outbox = src_path("deploy/k8s/components/outbox");
    char text[3 * PATH_MAX];
    snprintf(text, sizeof(text),
             "apiVersion: kustomize.config.k8s.io/v1beta1\n"
             "kind: Kustomization\n"
             "resources:\n  - ../..%s\ncomponents:\n  - ../..%s\n",
             dev, outbox);
    free(write_file(tmp, "kustomization.yaml", text));
    json_t *objs = render_dir(tmp);
    th_rmrf(tmp);
    free(tmp);
    free(dev);
    free(outbox);
    return objs;
}

/* The relay's Deployment runs `outbox -c` on its mounted ConfigMap, whose
 * configuration (with the DSN from the example Secret at the mounted path)
 * passes `check-config --for outbox` without printing the DSN; its probes
 * use http.listen's port, and the NetworkPolicy lets it reach PostgreSQL. */
Test(deploy, outbox_component_renders_and_its_config_passes, .timeout = 120)
{
    json_t *objs = render_dev_with_outbox();
    cr_expect(find_obj(objs, "Deployment", "idemproc", 0),
              "the processor is still there");
    json_t *d = find_obj(objs, "Deployment", "idemproc-outbox", 0);
    cr_assert(d, "no idemproc-outbox Deployment");
    json_t *c = container_named(d, "outbox");
    cr_assert(c);
    json_t *args = JGET(c, "args");
    cr_assert_eq(json_array_size(args), 3);
    cr_expect_str_eq(jstr(JGET(args, "#0")), "outbox");
    cr_expect_str_eq(jstr(JGET(args, "#1")), "-c");
    const char *cm_mount = mount_path(c, "config");
    cr_assert(cm_mount);
    char want[PATH_MAX];
    snprintf(want, sizeof(want), "%s/outbox.properties", cm_mount);
    cr_expect_str_eq(jstr(JGET(args, "#2")), want);
    json_t *pod = JGET(d, "spec", "template", "spec");
    cr_expect(json_is_true(JGET(pod, "securityContext", "runAsNonRoot")));
    cr_expect(json_is_false(JGET(pod, "enableServiceLinks")));
    cr_expect(
        json_is_true(JGET(c, "securityContext", "readOnlyRootFilesystem")));
    cr_expect_str_eq(jstr(JGET(c, "readinessProbe", "httpGet", "path")),
                     "/readyz");
    cr_expect_str_eq(jstr(JGET(c, "livenessProbe", "httpGet", "path")),
                     "/healthz");

    /* The configuration, with the Secret's files where the pod mounts
     * them. */
    json_t *cv = volume_named(d, "config");
    json_t *cm =
        find_obj(objs, "ConfigMap", jstr(JGET(cv, "configMap", "name")), 0);
    cr_assert(cm, "the mounted ConfigMap is not rendered");
    const char *props = jstr(JGET(cm, "data", "outbox.properties"));
    cr_assert(props);
    cr_expect(strstr(props, "http.listen=0.0.0.0:9464"), "%s", props);
    cr_expect_eq(jint(JGET(c, "ports", "#0", "containerPort")), 9464);
    json_t *sv = volume_named(d, "dsn");
    cr_assert(sv, "no dsn volume");
    const char *secret_name = jstr(JGET(sv, "secret", "secretName"));
    cr_expect_null(JGET(sv, "secret", "optional"),
                   "the DSN Secret is required");
    cr_expect_eq(count_kind(objs, "Secret"), 0,
                 "the DSN Secret is created out of band");
    char *example =
        src_path("deploy/k8s/components/outbox/secret.example.yaml");
    json_t *ex = yaml_file_to_json(example);
    free(example);
    cr_expect_str_eq(jstr(JGET(ex, "#0", "metadata", "name")), secret_name);
    const char *dsn = jstr(JGET(ex, "#0", "stringData", "dsn"));
    cr_assert(dsn && strstr(dsn, "password="), "the example has a dsn");
    char *dir = th_tmpdir();
    free(write_file(dir, "dsn", dsn));
    char from[PATH_MAX], to[PATH_MAX];
    snprintf(from, sizeof(from), "%s/", mount_path(c, "dsn"));
    snprintf(to, sizeof(to), "%s/", dir);
    cr_expect(strstr(props, from), "outbox.dsn.file is not in the mount");
    char *rewritten = replace_all(props, from, to);
    char *conf = write_file(dir, "outbox.properties", rewritten);
    free(rewritten);
    char *argv[] = {
        (char *)th_bin(), "check-config", "--for", "outbox", "-c", conf, NULL};
    char *env[] = {"PATH=/usr/bin:/bin", "IDEMPROC_MEMBER_ID=pod-0", NULL};
    char *out = NULL, *err = NULL;
    cr_expect_eq(th_run_env(argv, env, &out, &err, 30000), 0, "%s", err);
    cr_expect(out && strstr(out, "outbox.dsn=[redacted]\n"), "%s", out);
    const char *pw = strstr(dsn, "password=") + 9;
    cr_expect(out && !strstr(out, pw), "the DSN's password is printed");
    free(out);
    free(err);
    free(conf);
    th_rmrf(dir);
    free(dir);
    json_decref(ex);

    json_t *np = find_obj(objs, "NetworkPolicy", "idemproc-outbox", 0);
    cr_assert(np);
    cr_expect_str_eq(jstr(JGET(np, "spec", "podSelector", "matchLabels",
                               "app.kubernetes.io/component")),
                     jstr(JGET(d, "spec", "template", "metadata", "labels",
                               "app.kubernetes.io/component")));
    int pg = 0;
    size_t i, j;
    json_t *rule, *port;
    json_array_foreach(JGET(np, "spec", "egress"), i, rule)
        json_array_foreach(JGET(rule, "ports"), j, port) pg |=
        jint(JGET(port, "port")) == 5432;
    cr_expect(pg, "egress to PostgreSQL (5432) is not allowed");
    json_decref(objs);
}
