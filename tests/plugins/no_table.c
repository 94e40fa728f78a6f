/* no_table: a shared object that loads but is no idemproc plugin (it
 * exports no IDEMPROC_PLUGIN_SYMBOL): idemproc must say so. */
int idemproc_plugin_lookalike(void);

int idemproc_plugin_lookalike(void)
{
    return 1;
}
